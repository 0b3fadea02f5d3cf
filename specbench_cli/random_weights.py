"""Random weights of a real architecture (`--target random:NAME[:SEED]`, `models.RandomWeights`).

The model is built from NAME's published config.json on the run's device and dtype, without the library's own
initialisation, and every parameter is then drawn from its own generator, seeded by the run's seed and the
parameter's name: the same seed, device and dtype give the same weights in any process, whatever order the
parameters are built in. Matrices are drawn N(0, initializer_range) as the architecture's own initialisation
draws them; norms are ones and biases zeros. Such a target reads prompts with the embedded tokenizer
(architectures/README.md).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from specbench_methods.checkpoints import save
from specbench_methods.layers import rope_settings
from specbench_cli.models import ARCHITECTURES, RandomWeights, parse_random, random_sps_draft


def build(weights: RandomWeights, device: torch.device, dtype: torch.dtype, folder: Path | None = None) -> torch.nn.Module:
    """NAME's architecture on `device` in `dtype`, its weights drawn from the seed (`draw`). Its config.json is
    read from `folder` (the embedded model's, which `loading` converts), else the package's `architectures/NAME`."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    config = AutoConfig.from_pretrained(folder or ARCHITECTURES / weights.architecture)
    with torch.device(device), no_init_weights():  # the library's initialisation would be drawn and thrown away
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.tie_weights()  # tie_word_embeddings: one matrix, as a loaded checkpoint has it (the library ties it in init)
    draw(model, weights.seed, config.initializer_range)
    return model.eval()


@torch.no_grad()
def draw(model: torch.nn.Module, seed: int, std: float) -> None:
    """Every parameter from a generator of its own (tied weights are one parameter, drawn once)."""
    for name, param in model.named_parameters():
        if param.is_meta:  # an architecture built on the meta device (to count its parameters) holds no values
            continue
        if param.dim() > 1:
            generator = torch.Generator(device=param.device).manual_seed(parameter_seed(seed, name))
            param.normal_(0.0, std, generator=generator)
        elif "norm" in name:
            param.fill_(1.0)
        else:
            param.zero_()


def parameter_seed(seed: int, name: str) -> int:
    """A 63-bit seed from the run's seed and a parameter's name (Python's own hash of a str changes by process)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


# ---------------------------------------------------------------------------------------------- drafters
# `--drafter NAME=random[:SEED]`: a drafter with random weights at the shapes its method's released checkpoints
# have for this target, written once in the released format (a cache folder) and then loaded like any other.
RANDOM_DRAFTER = "random"
EAGLE3_DRAFT_VOCAB = 32000  # every released EAGLE-3 config (AngelSlim Qwen3, yuhuili Llama-3.1, SpecForge templates)
DFLASH_LAYERS, DFLASH_BLOCK = 5, 16  # z-lab/Qwen3-8B-DFlash-b16 and the SpecForge qwen3-{4b,8b}-dflash templates


def is_random_drafter(ref: str) -> bool:
    name, _, seed = ref.partition(":")
    return name == RANDOM_DRAFTER and (not seed or seed.isdigit())


def drafter_seed(ref: str, target_ref: str) -> int:
    """`random:SEED`'s seed; plain `random` takes a random target's own seed (0 for a checkpoint)."""
    seed = ref.partition(":")[2]
    target = parse_random(target_ref)
    return int(seed) if seed else target.seed if target is not None else 0


def random_drafter(name: str, target: torch.nn.Module, root: Path, seed: int, family: str) -> Path:
    """Drafter `name` (a key of RANDOM_DRAFTERS) for `target`, written once under `root` in a folder named for
    the target's architecture, dtype and the seed, and reused. `family`: the registered model the target's
    architecture is (`models.family`), which names an SpS drafter's shape."""
    key = hashlib.sha256(f"{target.config.to_json_string()}{target.dtype}".encode()).hexdigest()[:12]
    folder = root / f"{name}-{key}-seed{seed}"
    if (folder / "config.json").is_file():
        return folder
    dtype = target.get_input_embeddings().weight.dtype
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in the target's dtype: an 8 B target's DFlash is 4 GB in float32
    try:
        config, tensors = RANDOM_DRAFTERS[name](target, seed, family)
    finally:
        torch.set_default_dtype(previous)
    tmp = root / f".{folder.name}.partial"  # a killed write never leaves a folder that looks whole
    save(tmp, config, tensors)
    tmp.rename(folder)
    return folder


def _eagle3(target: torch.nn.Module, seed: int, family: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """One decoder layer of the target's own shape over its three feature layers, a 32,000-token draft head."""
    from specbench_methods.eagle3 import Eagle3Config, Eagle3Draft, default_capture

    t = target.config
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    c = Eagle3Config(hidden=t.hidden_size, target_hidden=t.hidden_size, heads=t.num_attention_heads,
                     kv_heads=t.num_key_value_heads, head_dim=head_dim, intermediate=t.intermediate_size,
                     eps=t.rms_norm_eps, rope_theta=rope_settings(t.to_dict())[0], rope_scaling=None,
                     draft_vocab=min(EAGLE3_DRAFT_VOCAB, t.vocab_size), vocab=t.vocab_size,
                     capture=default_capture(t.num_hidden_layers), norm_before_residual=False, qk_norm=False,
                     layer_prefix="midlayer.", own_embedding=False)
    draft = Eagle3Draft(c, target.get_input_embeddings().weight.detach())  # d2t zeros: the first 32,000 ids
    draw(draft, seed, t.initializer_range)
    return draft.export()


def _dflash(target: torch.nn.Module, seed: int, family: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """Five layers of the target's own shape reading five evenly spaced feature layers, blocks of 16, the mask
    token the last id of the vocabulary (the released Qwen3 drafters use 151669, also past the tokenizer's)."""
    from specbench_methods.dflash import DFlashConfig, DFlashDraft, default_capture

    t = target.config
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    c = DFlashConfig(hidden=t.hidden_size, heads=t.num_attention_heads, kv_heads=t.num_key_value_heads,
                     head_dim=head_dim, intermediate=t.intermediate_size, layers=DFLASH_LAYERS, eps=t.rms_norm_eps,
                     rope_theta=rope_settings(t.to_dict())[0], rope_scaling=None, capture=default_capture(t.num_hidden_layers), block_size=DFLASH_BLOCK,
                     mask_token_id=t.vocab_size - 1)
    draft = DFlashDraft(c, target)
    draw(draft, seed, t.initializer_range)
    return draft.export(t.num_hidden_layers)


def _sps(target: torch.nn.Module, seed: int, family: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """A draft model of the shape the target family's registered SpS drafter has (`models.RANDOM_SPS_DRAFTS`:
    Qwen/Qwen3-0.6B beside a Qwen3 target, Llama-3.2-1B beside a Llama-3.1 one), in the Hugging Face format it
    is released in; its own embedding and head, as the released model has them."""
    import json

    architecture = random_sps_draft(family)
    if architecture is None:
        raise ValueError(f"no random SpS drafter ships for {family} targets")
    draft = build(RandomWeights(architecture, seed), torch.device("cpu"), target.get_input_embeddings().weight.dtype)
    tied = draft.get_output_embeddings().weight is draft.get_input_embeddings().weight
    tensors = {k: v for k, v in draft.state_dict().items() if not (tied and k == "lm_head.weight")}  # one matrix
    return json.loads(draft.config.to_json_string()), tensors


RANDOM_DRAFTERS = {"eagle3": _eagle3, "dflash": _dflash, "sps": _sps}
