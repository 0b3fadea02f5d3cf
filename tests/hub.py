"""A Hugging Face hub of the released formats, offline: every repo id the registry names, with tiny weights (or, for
the GPU check's hub stage, random weights at the releases' own shapes: `Sizes`).

`write_hub(root)` lays each repo into a hub cache exactly as `huggingface_hub` lays one
(`models--ORG--NAME/{refs/main, snapshots/<commit>/<file> -> ../../blobs/<hash>, blobs/}`), so that with
`HF_HUB_CACHE=<root>` and `HF_HUB_OFFLINE=1` both `from_pretrained(repo_id)` and `snapshot_download(repo_id)`
resolve, and the user's path (`run --model qwen3-8b`, `--engine vllm` with hub ids) runs as it would on a machine
with hub access. The snapshot of a repo whose revision the registry pins is named by that commit.

What each repo holds is its release's layout, shrunk: the file names (sharded safetensors with an index where the
release is sharded, EAGLE-3's flat `pytorch_model.bin`, DART's `.trie` files), the config keys and tensor names,
tiny shapes. The targets' weights are written by transformers' `save_pretrained`; their config.json is the
released one (`specbench_cli/architectures/`, copied from the hub) with its sizes shrunk, since save_pretrained of
transformers 5 would rewrite its keys. The drafters' tensors are written by our own exports (the tensor names are
the format), their config.json as the release's keys, each with its source named in `DRAFTER_SOURCES`. The
speculators-layout drafter is written by speculators itself, in the engine's Python, where it is installed.
The tokenizer is a stand-in: a byte-level BPE trained on the vendored prompts, with each family's special tokens
and a chat template of the family's shape (Qwen3's takes `enable_thinking`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench_cli.models import ARCHITECTURES
from specbench_methods.layers import rope_settings

# head_dim 32: the smallest vLLM's CPU attention takes (vllm/v1/attention/backends/cpu_attn.py, 0.32), and
# hidden / heads, since Llama's released config names no head_dim
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 64, 2, 1, 32, 128
TARGET_LAYERS = 8  # EAGLE-3's default feature layers (1, L/2-1, L-4) are three distinct layers from 8 up


@dataclass(frozen=True)
class Sizes:
    """How big the hub's checkpoints are: tiny (every test), or the releases' own shapes with random weights
    (`released`: the GPU check's real-format stage, built on `device`)."""

    released: bool = False
    device: str = "cpu"

    @property
    def draft_vocab(self) -> int:  # EAGLE-3's and DART's draft heads: a part of the target's vocabulary
        return 32000 if self.released else 256  # 32,000 of 151,936 in every release

    @property
    def dflash(self) -> tuple[int, int]:  # (layers, block): z-lab's Qwen3 releases, or tiny
        return (5, 16) if self.released else (2, 8)


TINY = Sizes()
QWEN_VOCAB = 640  # Qwen3's embedding is padded past its tokenizer (151,936 rows for 151,669 tokens)
BPE_SIZE = 480  # the stand-in tokenizer's learned vocabulary (bytes and merges), before the special tokens

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|eom_id|>"]
QWEN_TEMPLATE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")
LLAMA_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}{%- for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")

# Where each drafter repo's config keys and files come from (the facts in docs/models.md).
DRAFTER_SOURCES = {
    "flat-eagle3": "SafeAILab/EAGLE eagle/traineagle3/config.json and AngelSlim's template "
                   "train/configs/qwen3-8b-eagle3.json: LlamaConfig keys + draft_vocab_size; flat state dict in "
                   "pytorch_model.bin (fc, midlayer.*, norm, lm_head, d2t, t2d; no embedding)",
    "yuhuili-eagle3": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B config.json: no rope_theta, no rope_scaling "
                      "(the reference's rotary then uses base 10000); pytorch_model.bin",
    "dflash": "z-lab/dflash model.py and SpecForge configs/qwen3-8b-dflash.json: block_size, num_target_layers, "
              "dflash_config {mask_token_id, target_layer_ids}; model.safetensors without embedding or head",
    "dart": "fvliang/DART dart/model/llama3_dart.py: the flat EAGLE-3 keys + midlayer.mask_rep and draft_length; "
            "model.safetensors",
    "dart-trie": "fvliang/DART cpplib/cpp_ngram/trie_ngram.cpp: small.trie and full.trie, order 3",
    "speculators": "vllm-project/speculators 0.9.0 Eagle3DraftModel.save_pretrained (its own writer)",
}


@dataclass(frozen=True)
class Target:
    """A registered target or SpS draft model: the released config it shrinks, its family, its shards."""

    repo: str
    architecture: str  # the folder under specbench_cli/architectures/ with its released config.json
    family: str  # "qwen3" or "llama"
    layers: int = TARGET_LAYERS
    shards: int = 1  # >1: model-0000k-of-0000n.safetensors + model.safetensors.index.json, as the release has


TARGETS = [
    Target("Qwen/Qwen3-8B", "qwen3-8b", "qwen3", shards=5),
    Target("Qwen/Qwen3-4B", "qwen3-4b", "qwen3", shards=3),
    Target("Qwen/Qwen3-1.7B", "qwen3-1.7b", "qwen3", layers=4, shards=2),
    Target("Qwen/Qwen3-0.6B", "qwen3-0.6b", "qwen3", layers=4),
    Target("meta-llama/Llama-3.1-8B-Instruct", "llama3.1-8b", "llama", shards=4),
    Target("meta-llama/Llama-3.2-1B-Instruct", "llama3.2-1b", "llama", layers=4),
]


# ---------------------------------------------------------------------------------------------- the cache
def commit_of(repo: str, files: dict[str, bytes]) -> str:
    """The snapshot's name: the registry's pinned revision of `repo`, else a hash of its files."""
    from specbench_cli.models import REVISIONS

    pinned = REVISIONS.get(repo)
    if pinned:
        return pinned
    digest = hashlib.sha1(repo.encode())
    for name in sorted(files):
        digest.update(name.encode() + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()


def lay(cache: Path, repo: str, folder: Path, commit: str | None = None) -> Path:
    """Lay the files of `folder` into `cache` as huggingface_hub does: content-named blobs, a snapshot of
    relative symlinks named by the commit (`commit_of` unless given), and refs/main naming it. Returns the
    snapshot folder."""
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    base = cache / f"models--{repo.replace('/', '--')}"
    commit = commit or commit_of(repo, files)
    snapshot = base / "snapshots" / commit
    (base / "blobs").mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = base / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (base / "refs").mkdir(exist_ok=True)
    (base / "refs" / "main").write_text(commit)
    return snapshot


# ---------------------------------------------------------------------------------------------- tokenizers
def corpus() -> list[str]:
    """The vendored prompts' text, which the stand-in tokenizer learns its merges from."""
    from specbench_cli.datasets import load_dataset

    return [turn for name in ("spec-bench", "mt-bench") for p in load_dataset(name) for turn in p.turns]


def write_tokenizer(folder: Path, family: str, texts: list[str]) -> dict[str, int]:
    """A byte-level BPE with the family's special tokens and chat template; returns the special tokens' ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = QWEN_SPECIALS if family == "qwen3" else LLAMA_SPECIALS
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    bpe.add_special_tokens(specials)
    if family == "qwen3":
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    else:
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    tokenizer.chat_template = QWEN_TEMPLATE if family == "qwen3" else LLAMA_TEMPLATE
    tokenizer.save_pretrained(folder)
    return {t: bpe.token_to_id(t) for t in specials}


# ---------------------------------------------------------------------------------------------- targets
def shrunk_config(target: Target, vocab: int, ids: dict[str, int], sizes: Sizes = TINY) -> dict:
    """The released config.json with its sizes shrunk (unless `sizes.released`) and its token ids the stand-in
    tokenizer's; every other key (rope settings, max_position_embeddings, dtype, the transformers version it was
    saved by) kept."""
    config = json.loads((ARCHITECTURES / target.architecture / "config.json").read_text())
    if not sizes.released:
        config.update(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                      intermediate_size=INTERMEDIATE, num_hidden_layers=target.layers, vocab_size=vocab)
        if "head_dim" in config or target.family == "qwen3":
            config["head_dim"] = HEAD_DIM
        if "max_window_layers" in config:
            config["max_window_layers"] = target.layers
    if target.family == "qwen3":
        config.update(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    else:
        eos = [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]
        config.update(bos_token_id=ids["<|begin_of_text|>"], eos_token_id=eos if isinstance(config["eos_token_id"], list)
                      else ids["<|end_of_text|>"])
    return config


def generation_config(target: Target, ids: dict[str, int]) -> dict:
    """generation_config.json as the releases have it (Qwen3's sampling defaults; Llama-3.1's three EOS ids)."""
    if target.family == "qwen3":
        return {"bos_token_id": ids["<|endoftext|>"], "do_sample": True,
                "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "pad_token_id": ids["<|endoftext|>"],
                "temperature": 0.6, "top_k": 20, "top_p": 0.95}
    return {"bos_token_id": ids["<|begin_of_text|>"], "do_sample": True, "temperature": 0.6, "top_p": 0.9,
            "eos_token_id": [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]}


def write_target(folder: Path, target: Target, texts: list[str], seed: int, sizes: Sizes = TINY) -> torch.nn.Module:
    """The target's folder: weights by save_pretrained (sharded with an index where the release is), the
    released config (shrunk), generation_config.json, the stand-in tokenizer. Returns the model (tiny: float32;
    released: bfloat16 on `sizes.device`)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from specbench_cli.random_weights import draw

    ids = write_tokenizer(folder, target.family, texts)
    size = BPE_SIZE + len(ids)
    config = shrunk_config(target, QWEN_VOCAB if target.family == "qwen3" else size, ids, sizes)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    dtype = torch.bfloat16 if sizes.released else torch.float32
    with torch.device(sizes.device), no_init_weights():  # an 8 B model: drawn once, on the device
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype,
                                                 attn_implementation="sdpa")
    model.tie_weights()
    draw(model, seed, 0.02)
    with torch.no_grad():  # a peaked next-token distribution, as a trained model has, so greedy ties are rare
        model.get_output_embeddings().weight.mul_(8.0) if not config.get("tie_word_embeddings") else None
    weights = sum(p.numel() * 2 for p in model.parameters())  # bf16 bytes
    released = config  # save_pretrained writes a transformers-5 config; the release's goes back over it
    shard = int(weights / (target.shards - 0.5)) if target.shards > 1 else "10GB"  # n shards, the last one short
    model.to(torch.bfloat16).save_pretrained(folder, max_shard_size=shard)
    (folder / "config.json").write_text(json.dumps(released, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(generation_config(target, ids), indent=2))
    return (model if sizes.released else model.float()).eval()


# ---------------------------------------------------------------------------------------------- drafters
def head_dim(t) -> int:
    return getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads


def eagle3_tensors(target: torch.nn.Module, seed: int, extra: str = "", sizes: Sizes = TINY) -> tuple:
    """A flat-layout EAGLE-3 (or, with extra="dart", DART) draft for `target` at `sizes.draft_vocab`, with a
    sorted vocabulary map (d2t) as the releases build it, its weights drawn from `seed`: (its Eagle3Config, the
    config.json our export writes, the tensors in bf16)."""
    from specbench_cli.random_weights import draw
    from specbench_methods.dart import DartDraft
    from specbench_methods.eagle3 import Eagle3Config, Eagle3Draft, default_capture

    t = target.config
    c = Eagle3Config(hidden=t.hidden_size, target_hidden=t.hidden_size, heads=t.num_attention_heads,
                     kv_heads=t.num_key_value_heads, head_dim=head_dim(t), intermediate=t.intermediate_size,
                     eps=t.rms_norm_eps, rope_theta=rope_settings(t.to_dict())[0],
                     rope_scaling=None, draft_vocab=sizes.draft_vocab, vocab=t.vocab_size,
                     capture=default_capture(t.num_hidden_layers), norm_before_residual=False, qk_norm=False,
                     layer_prefix="midlayer.", own_embedding=False, mask_slots=4 if extra == "dart" else 0)
    embedding = target.get_input_embeddings().weight.detach()
    with torch.device(embedding.device):
        draft = (DartDraft if extra == "dart" else Eagle3Draft)(c, embedding).to(embedding.dtype)
    draw(draft, seed, 0.02)
    generator = torch.Generator().manual_seed(seed)
    kept = torch.randperm(t.vocab_size, generator=generator)[:sizes.draft_vocab].sort().values
    draft.d2t.copy_(kept - torch.arange(sizes.draft_vocab))  # target id = draft id + d2t[draft id]
    config, tensors = draft.export()
    return c, config, {k: v.detach().to("cpu", torch.bfloat16 if v.is_floating_point() else v.dtype).clone()
                       for k, v in tensors.items()}


def flat_eagle3_config(c, target: torch.nn.Module, rope: bool, architecture: str = "LlamaForCausalLMEagle3") -> dict:
    """The released flat EAGLE-3 config.json keys (LlamaConfig's + draft_vocab_size); `rope=False` leaves out
    rope_theta and rope_scaling, as yuhuili's Llama-3.1 release does."""
    t = target.config
    config = {"architectures": ["LlamaForCausalLM"], "bos_token_id": t.bos_token_id, "eos_token_id": t.eos_token_id,
              "hidden_act": "silu", "hidden_size": c.hidden, "initializer_range": 0.02,
              "intermediate_size": c.intermediate, "max_position_embeddings": 2048, "model_type": "llama",
              "num_attention_heads": c.heads, "num_hidden_layers": 1, "num_key_value_heads": c.kv_heads,
              "pretraining_tp": 1, "rms_norm_eps": c.eps, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "transformers_version": "4.46.2", "use_cache": True, "vocab_size": c.vocab,
              "draft_vocab_size": c.draft_vocab}
    if rope:
        config.update(head_dim=c.head_dim, rope_theta=c.rope_theta, rope_scaling=None, architectures=[architecture])
    return config


def write_flat_eagle3(folder: Path, target: torch.nn.Module, seed: int, rope: bool, bin: bool,
                      architecture: str = "LlamaForCausalLMEagle3", sizes: Sizes = TINY) -> None:
    """`bin`: a torch.save of the flat state dict in pytorch_model.bin (AngelSlim's Qwen3-8B, yuhuili's), else
    model.safetensors (AngelSlim's Qwen3-4B, whose config names `Eagle3LlamaForCausalLM`)."""
    from safetensors.torch import save_file

    c, _, tensors = eagle3_tensors(target, seed, sizes=sizes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(flat_eagle3_config(c, target, rope, architecture), indent=2))
    if bin:
        torch.save(tensors, folder / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
                  metadata={"format": "pt"})


def write_dart(folder: Path, target: torch.nn.Module, seed: int) -> None:
    from safetensors.torch import save_file

    c, _, tensors = eagle3_tensors(target, seed, extra="dart")
    config = {**flat_eagle3_config(c, target, rope=True), "architectures": ["LlamaForCausalLMDart"],
              "draft_length": c.mask_slots}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})


def write_trie(folder: Path, tokenizer_folder: Path, texts: list[str]) -> None:
    """small.trie and full.trie (order 3) over the prompts' tokens, each text ending in EOS, as ngram_build.py
    builds them (the small one over a part of the text)."""
    from transformers import AutoTokenizer

    from specbench_methods.ngram import Trie

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    sequences = [tokenizer(text)["input_ids"] + [tokenizer.eos_token_id] for text in texts]
    folder.mkdir(parents=True, exist_ok=True)
    Trie.build(sequences[: len(sequences) // 4]).save(folder / "small.trie")
    Trie.build(sequences).save(folder / "full.trie")
    (folder / "README.md").write_text("n-gram tries for DART (stand-in tokenizer)\n")


def write_dflash(folder: Path, target: torch.nn.Module, seed: int, nested: bool = False, block: int | None = None,
                 sizes: Sizes = TINY) -> None:
    """z-lab's layout: `block_size` at the top level (the registered releases, read so by z-lab's model.py at
    44947fb) or inside `dflash_config` (`nested`: the later Qwen3.5 releases)."""
    from safetensors.torch import save_file

    from specbench_cli.random_weights import draw
    from specbench_methods.dflash import DFlashConfig, DFlashDraft, default_capture

    t = target.config
    layers, block = sizes.dflash[0], block or sizes.dflash[1]
    c = DFlashConfig(hidden=t.hidden_size, heads=t.num_attention_heads, kv_heads=t.num_key_value_heads,
                     head_dim=head_dim(t), intermediate=t.intermediate_size, layers=layers, eps=t.rms_norm_eps,
                     rope_theta=rope_settings(t.to_dict())[0], rope_scaling=None,
                     capture=default_capture(t.num_hidden_layers), block_size=block, mask_token_id=t.vocab_size - 1)
    with torch.device(target.device):
        draft = DFlashDraft(c, target).to(target.dtype)
    draw(draft, seed, 0.02)
    config, tensors = draft.export(t.num_hidden_layers)
    config.update(auto_map={"AutoModel": "dflash.DFlashDraftModel"}, torch_dtype="bfloat16",
                  attention_bias=False, max_position_embeddings=t.max_position_embeddings)
    if nested:
        config["dflash_config"]["block_size"] = config.pop("block_size")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "dflash.py").write_text("# the release's remote code, which specbench never runs\n")
    save_file({k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in tensors.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})


def write_speculators(folder: Path, target: torch.nn.Module, target_folder: Path, python: str) -> None:
    """The speculators layout (RedHatAI/*-speculator.eagle3), written by speculators itself in the engine's Python
    (tests/engine_side/speculators_writer.py) from a flat draft and the target's embedding and final norm."""
    from safetensors.torch import save_file

    inputs = folder.parent / f".{folder.name}.inputs"
    _, config, tensors = eagle3_tensors(target, 19)
    for part, files in (("flat", {"model.safetensors": tensors}),
                        ("target", {"model.safetensors": {k: v.detach().to(torch.bfloat16).contiguous()
                                                          for k, v in target.state_dict().items()
                                                          if k in ("model.embed_tokens.weight", "model.norm.weight")}})):
        (inputs / part).mkdir(parents=True)
        for name, state in files.items():
            save_file({k: v.contiguous() for k, v in state.items()}, str(inputs / part / name))
    (inputs / "flat" / "config.json").write_text(json.dumps(config))
    shutil.copy(target_folder / "config.json", inputs / "target" / "config.json")
    script = Path(__file__).parent / "engine_side" / "speculators_writer.py"
    subprocess.run([python, str(script), "eagle3", str(inputs / "flat"), str(inputs / "target"), str(folder)],
                   check=True, capture_output=True, text=True, cwd=inputs)
    shutil.rmtree(inputs)
    config = json.loads((folder / "config.json").read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = "Qwen/Qwen3-8B"  # the writer names the folder it read
    (folder / "config.json").write_text(json.dumps(config, indent=2))


# ---------------------------------------------------------------------------------------------- the hub
@dataclass
class Hub:
    cache: Path  # HF_HUB_CACHE
    snapshots: dict[str, Path]  # repo id -> its snapshot folder


def write_hub(root: Path, engine_python: str | None = None, only: set[str] | None = None,
              sizes: Sizes = TINY) -> Hub:
    """Every repo the registry names (or those in `only`, with the targets their drafters are built for), in
    `root/hub` (HF_HUB_CACHE), built in `root/build` first."""
    build, cache = root / "build", root / "hub"
    texts = corpus()
    wanted = (lambda repo: True) if only is None else only.__contains__
    bases = {"Qwen/Qwen3-8B", "Qwen/Qwen3-4B", "meta-llama/Llama-3.1-8B-Instruct"}  # the drafters' targets
    models: dict[str, torch.nn.Module] = {}
    folders: dict[str, Path] = {}
    for i, target in enumerate(TARGETS):
        if wanted(target.repo) or (only is None and target.repo in bases):
            folder = build / target.repo
            folder.mkdir(parents=True)
            models[target.repo] = write_target(folder, target, texts, seed=i, sizes=sizes)
            folders[target.repo] = folder
    qwen8, qwen4, llama8 = (models.get(r) for r in ("Qwen/Qwen3-8B", "Qwen/Qwen3-4B", "meta-llama/Llama-3.1-8B-Instruct"))
    drafters = {
        "AngelSlim/Qwen3-8B_eagle3": lambda f: write_flat_eagle3(f, qwen8, 11, rope=True, bin=True, sizes=sizes),
        "AngelSlim/Qwen3-4B_eagle3": lambda f: write_flat_eagle3(f, qwen4, 12, rope=True, bin=False, sizes=sizes,
                                                                 architecture="Eagle3LlamaForCausalLM"),
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": lambda f: write_flat_eagle3(f, llama8, 13, rope=False, bin=True,
                                                                           sizes=sizes),
        "z-lab/Qwen3-8B-DFlash-b16": lambda f: write_dflash(f, qwen8, 14, sizes=sizes),
        "z-lab/Qwen3-4B-DFlash-b16": lambda f: write_dflash(f, qwen4, 15, sizes=sizes),
        # block 10 (a third party's pin of this drafter says K=10; the config itself was not seen)
        "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat": lambda f: write_dflash(f, llama8, 16, block=10, sizes=sizes),
        "fvliang/qwen8b-dart": lambda f: write_dart(f, qwen8, 17),
        "fvliang/qwen4b-dart": lambda f: write_dart(f, qwen4, 18),
        "fvliang/dart-qwen3-ngram": lambda f: write_trie(f, folders["Qwen/Qwen3-8B"], texts),
    }
    for repo, write in drafters.items():
        if wanted(repo):
            write(build / repo)
            folders[repo] = build / repo
    if engine_python and wanted("RedHatAI/Qwen3-8B-speculator.eagle3"):  # written by speculators, where installed
        repo = "RedHatAI/Qwen3-8B-speculator.eagle3"
        write_speculators(build / repo, qwen8, folders["Qwen/Qwen3-8B"], engine_python)
        folders[repo] = build / repo
    del models
    snapshots = {repo: lay(cache, repo, folder) for repo, folder in folders.items()}
    shutil.rmtree(build)
    return Hub(cache, snapshots)


@contextmanager
def offline_hub(tmp_path_factory, engine_python: str | None = None) -> Iterator[Hub]:
    """A hub written for a test module, read as this process's and its children's hub cache (huggingface_hub reads
    HF_HUB_CACHE into a constant at its import, so both are set), with a specbench cache and drafters folder of its
    own (calibrate writes into the latter)."""
    import pytest
    from huggingface_hub import constants

    from specbench_cli import models

    built = write_hub(tmp_path_factory.mktemp("hub"), engine_python)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_CACHE", str(built.cache))
        patch.setenv("HF_HUB_CACHE", str(built.cache))
        patch.setenv("SPECBENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
        patch.setattr(models, "PROJECT_DRAFTERS", tmp_path_factory.mktemp("drafters"))
        yield built


def main() -> None:
    """`python -m tests.hub ROOT [--released] [--device cuda] [--only REPO ...]`: write the hub (the GPU check)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument("--released", action="store_true", help="the releases' own shapes, random weights")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", nargs="*", help="these repos (and nothing else)")
    a = parser.parse_args()
    hub = write_hub(a.root, only=set(a.only) if a.only else None, sizes=Sizes(a.released, a.device))
    for repo, snapshot in hub.snapshots.items():
        size = sum(p.stat().st_size for p in snapshot.rglob("*") if p.is_file()) / 2**30
        print(f"{repo}: {snapshot} ({size:.2f} GiB)")


if __name__ == "__main__":
    main()
