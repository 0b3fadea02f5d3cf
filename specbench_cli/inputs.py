"""A run's settings and every check that needs no model and no torch.

`specbench run` calls `check_run` before it imports torch or transformers, so a typo, a number out of range,
a bad dataset file or an existing results folder is answered at once, in one line. The checks that need the
method's code (its options, its drafter names) or torch (the device) follow in `runner.plan`, still before
any model loads.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from specbench_cli.core.errors import UsageError, unknown
from specbench_cli.core.options import options_record
from specbench_cli.datasets import Prompt, dataset_slug, load_dataset, parse_shard, select, warmup_prompts
from specbench_cli.models import ModelSpec, get_model_spec
from specbench_cli.registry import METHODS

if TYPE_CHECKING:
    import torch

# --compile's verify sizes: core.target.DEFAULT_BUCKETS as text (torch-free here; a test keeps them equal)
DEFAULT_BUCKETS = "1,4,16,64"
DTYPE_NAMES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
INVARIANT_CHOICES = ("auto", "on", "off")


@dataclass
class RunConfig:
    method: str = "baseline"
    model: str = "smollm2-135m"
    dataset: str = "spec-bench"
    categories: list[str] = field(default_factory=list)
    limit: int | None = None
    shard: str | None = None
    max_new_tokens: int = 1024
    temperature: float = 0.0
    seed: int = 0
    dtype: str = "auto"
    device: str = "auto"
    warmup: int = 1
    out: Path | None = None
    resume: bool = False
    opts: list[str] = field(default_factory=list)
    target: str | None = None
    drafters: list[str] = field(default_factory=list)
    results_root: Path = Path("results")
    compile: bool = False
    compile_buckets: str = DEFAULT_BUCKETS
    batch_invariant: str = "auto"  # the target's verify rows computed as one-row decodes (core.target)
    tuned: bool = False  # apply `specbench tune`'s budget for this model, method and machine setting


@dataclass
class Plan:
    """A checked run: everything but the loaded model. `check_run` fills the selection (no torch needed);
    `runner.plan` adds what needs the method's code or torch (its options and drafters, device, dtype)."""

    config: RunConfig
    spec: ModelSpec
    prompts: list[Prompt]
    warmup: list[Prompt]
    shard: tuple[int, int]
    out: Path
    buckets: tuple[int, ...]
    method_cls: type | None = None
    options: object = None
    drafters: dict[str, str] = field(default_factory=dict)
    device: torch.device | None = None
    dtype: torch.dtype | None = None
    dtype_reason: str = ""  # why this dtype (`loading.resolve_dtype`): run.json's dtype_choice
    tuned_from: str = ""  # the tune record whose budget --tuned applied (run.json's tuned_from)
    compile_mode: str | None = None  # None = eager; "reduce-overhead" (CUDA graphs) on GPU, "inductor" on CPU
    batch_invariant: bool = False
    notes: list[str] = field(default_factory=list)  # lines to show before the run starts (deprecated spellings)

    def settings(self) -> dict:
        """What run.json records as the run's settings (and a resume must match)."""
        c = self.config
        return {"method": c.method, "model": c.model, "dataset": c.dataset, "categories": c.categories,
                "limit": c.limit, "shard": f"{self.shard[0]}/{self.shard[1]}", "max_new_tokens": c.max_new_tokens,
                "temperature": c.temperature, "seed": c.seed, "dtype": str(self.dtype).removeprefix("torch."),
                "options": options_record(self.options), "target": self.spec.target, "drafters": self.drafters,
                "warmup": [p.id for p in self.warmup], "batch_invariant": self.batch_invariant,
                "compile": None if self.compile_mode is None else {"mode": self.compile_mode, "buckets": list(self.buckets)}}


def at_least(option: str, value: float | None, low: float) -> None:
    """One range rule for every numeric option: finite and >= low (None = the option was not given)."""
    if value is not None and not math.isfinite(value):
        raise UsageError(f"{option} must be a finite number (got {value})")
    if value is not None and value < low:
        raise UsageError(f"{option} must be at least {low:g} (got {value:g})")


def check_run(config: RunConfig, env: dict[str, str]) -> Plan:
    """Every check of a run that needs neither torch nor a model, in the order a user would fix them."""
    if config.method not in METHODS:
        raise unknown("method", config.method, METHODS)
    at_least("--max-new-tokens", config.max_new_tokens, 1)
    at_least("--temperature", config.temperature, 0)
    at_least("--limit", config.limit, 1)
    at_least("--warmup", config.warmup, 0)
    if config.dtype not in DTYPE_NAMES:
        raise unknown("dtype", config.dtype, DTYPE_NAMES)
    if config.batch_invariant not in INVARIANT_CHOICES:
        raise unknown("--batch-invariant setting", config.batch_invariant, INVARIANT_CHOICES)
    if not re.fullmatch(r"auto|cpu|split|cuda(:\d+)?|mps", config.device):
        raise UsageError(f"bad --device '{config.device}': expected auto, cpu, cuda, cuda:N or split")
    spec = get_model_spec(config.model, config.target)
    everything = load_dataset(config.dataset)
    chosen = select(everything, config.categories, config.limit)
    shard = parse_shard(config.shard, env)
    prompts = chosen[shard[0]::shard[1]]
    if not prompts:
        raise UsageError("no prompts selected (check --category, --limit and --shard)")
    out = config.out or config.results_root / default_name(config, shard)
    if out.exists() and not config.resume:
        raise UsageError(f"results directory {out} exists; pass --resume to continue it or --out for a new one")
    if config.resume and not (out / "run.json").is_file():
        raise UsageError(f"--resume: no run to continue at {out}")
    return Plan(config, spec, prompts, warmup_prompts(everything, prompts, config.warmup), shard, out,
                parse_buckets(config.compile_buckets))


def default_name(c: RunConfig, shard: tuple[int, int]) -> str:
    name = f"{c.model}_{dataset_slug(c.dataset)}_{c.method}{'-tuned' if c.tuned else ''}_t{c.temperature:g}"
    return name + (f"_shard{shard[0]}of{shard[1]}" if shard[1] > 1 else "")


def parse_buckets(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] < 1:
        raise UsageError(f"--compile-buckets '{text}': expected comma-separated positive sizes such as 1,8,32,128")
    return sizes
