"""A run's settings and every check that needs no model and no torch.

`specbench run` calls `check_run` before it imports torch or transformers, so a typo, a number out of range,
a bad dataset file or an existing results folder is answered at once, in one line. The checks that need the
method's code (its options, its drafter names) or torch (the device) follow in `planning.plan`, still before
any model loads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from specbench_cli.core.errors import UsageError, unknown
from specbench_cli.options import options_record
from specbench_cli.datasets import Prompt, dataset_slug, load_dataset, parse_shard, select, warmup_prompts
from specbench_cli.models import ModelSpec, get_model_spec
from specbench_cli.registry import METHODS, engine_entry, load
from specbench_cli.core.dtypes import SPELLINGS, dtype_name

if TYPE_CHECKING:
    import torch

# --compile's verify sizes: core.target.DEFAULT_BUCKETS as text (torch-free here; a test keeps them equal)
DEFAULT_BUCKETS = "1,4,16,64"
DTYPE_NAMES = ("auto", *SPELLINGS)
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
    cpu_budget: bool = False  # on a CPU, a method's recorded CPU budget (budgets.CPU_BUDGETS); `run` sets it
    engine: str = "specbench"  # who decodes: our loop, or a production engine (engines/)
    engine_args: list[str] = field(default_factory=list)  # KEY=VALUE passed to the engine unchanged
    engine_python: str | None = None  # the Python that runs the engine (engines/vllm.py: engine_python)
    concurrency: int = 1  # requests an engine keeps in flight (a closed loop)
    batch_size: int = 1  # sequences our engine decodes together (core/engine.py)
    engine_url: str | None = None  # a running vLLM server to measure (engines/vllm_server.py)
    engine_serve: bool = False  # start `vllm serve` and reach it over HTTP instead of the in-process engine
    threads: int | None = None  # --threads: an engine process's CPU threads too
    repeat: int = 1  # passes over the selection (`run --repeat`), interleaved with the other methods of a list
    acceptance: list[str] = field(default_factory=list)  # `--acceptance [METHOD.]synthetic:RATE | profile:FILE`
    replay: bool = True  # each temperature-0 turn's tokens checked against the target's greedy choice (greedy_replay.py)


@dataclass
class EnginePlan:
    """What a run on a production engine adds to its plan (`Plan.engine`; None on our engine): the parsed
    --engine-arg and the engine's Python (its `check`, engines/options.py), then what the engine's `plan` hook
    fills (the speculative config the method maps to, where the engine drafts otherwise, a specbench proposer run
    inside it)."""

    args: dict = field(default_factory=dict)  # --engine-arg, parsed (`engines.options.parse_engine_args`)
    python: str = ""  # the Python that runs the engine ("" for a server at --engine-url)
    speculative_config: dict | None = None  # what the run asks the engine for (engines/vllm_methods.py)
    known_differences: list[str] = field(default_factory=list)  # where the engine drafts otherwise (run.json)
    proposer: dict | None = None  # specbench's own proposer inside the engine (engines/vllm_routed.py)
    schedule: list[list[int]] | None = None  # `run --tuned`: the draft length per batch size `tune` chose (vLLM's form)
    share: float = 1.0  # of one GPU's memory: 1/n for each of the n engines a `--engine vllm` list runs side by side


@dataclass
class Plan:
    """A checked run: everything but the loaded model. `check_run` fills the selection (no torch needed);
    `planning.plan` adds what needs the method's code or torch (its options and drafters, device, dtype)."""

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
    cpu_budget_from: str = ""  # the record of the CPU budget applied (run.json's cpu_budget_from)
    compile_mode: str | None = None  # None = eager; "reduce-overhead" (CUDA graphs) on GPU, "inductor" on CPU
    batch_invariant: bool = False
    prepacked: bool = False  # the target's CPU weights prepacked for oneDNN (core.kernels)
    engine: EnginePlan | None = None  # a production engine's own plan (engines/); None on our engine
    notes: list[str] = field(default_factory=list)  # lines to show before the run starts (deprecated spellings)
    acceptance: SetAcceptance | None = None  # `--acceptance`: rates the user set in place of the target's decision

    def settings(self) -> dict:
        """What run.json records as the run's settings (and a resume must match)."""
        c = self.config
        return {"method": c.method, "model": c.model, "dataset": c.dataset, "categories": c.categories,
                "limit": c.limit, "shard": f"{self.shard[0]}/{self.shard[1]}", "max_new_tokens": c.max_new_tokens,
                "temperature": c.temperature, "seed": c.seed, "dtype": dtype_name(self.dtype),
                "options": options_record(self.options), "target": self.spec.target, "drafters": self.drafters,
                "warmup": [p.id for p in self.warmup], "batch_invariant": self.batch_invariant,
                "compile": None if self.compile_mode is None else {"mode": self.compile_mode, "buckets": list(self.buckets)},
                **({"batch_size": c.batch_size} if c.batch_size > 1 else {}),
                **({"repeat": c.repeat} if c.repeat > 1 else {}),
                **({"prepacked": True} if self.prepacked else {}),
                **({"acceptance": self.acceptance.source} if self.acceptance else {}), **self.engine_settings()}

    def engine_settings(self) -> dict:
        """An engine run's own settings (none for our engine, whose runs predate engines)."""
        c, e = self.config, self.engine
        if e is None:
            return {}
        reached = {"engine_url": c.engine_url} if c.engine_url else {"engine_serve": True} if c.engine_serve else {}
        proposer = {"engine_proposer": e.proposer} if e.proposer else {}
        return {"engine": c.engine, "engine_args": e.args, "speculative_config": e.speculative_config,
                "concurrency": c.concurrency, **proposer, **reached}


def at_least(option: str, value: float | None, low: float) -> None:
    """One range rule for every numeric option: finite and >= low (None = the option was not given)."""
    if value is not None and not math.isfinite(value):
        raise UsageError(f"{option} must be a finite number (got {value})")
    if value is not None and value < low:
        raise UsageError(f"{option} must be at least {low:g} (got {value:g})")


@dataclass(frozen=True)
class SetAcceptance:
    """`--acceptance`: the conditional accept rate at each draft depth (the last one for deeper positions) and
    where it came from (run.json's settings.acceptance; a report marks the method's label with it)."""

    rates: tuple[float, ...]
    source: str  # "synthetic:0.7" or "profile:/absolute/path.json"


MEMBER_ACCEPTANCE = re.compile(r"([\w.-]+?)\.((?:synthetic|profile):.*)")  # eagle3.synthetic:0.8


def acceptance_for(entries: list[str], method: str, methods: list[str], drafts: bool = True) -> str | None:
    """The `--acceptance` entry for `method` of a run of `methods`: its own (`METHOD.SPEC`) before the one for
    every method (`SPEC`), which a method that never drafts (`drafts` False: a list's baseline) does not take;
    one line for an entry that names no method of the run, or two for one method."""
    own, common = {}, []
    for entry in entries:
        member = MEMBER_ACCEPTANCE.fullmatch(entry)
        if member is None:
            common.append(entry)
        elif member[1] not in methods:
            raise UsageError(f"--acceptance {entry}: {member[1]} is not a method of this run ({', '.join(methods)})")
        elif member[1] in own:
            raise UsageError(f"--acceptance: two entries for {member[1]}")
        else:
            own[member[1]] = member[2]
    if len(common) > 1:
        raise UsageError(f"--acceptance: two entries for every method ({', '.join(common)}); name each: METHOD.SPEC")
    return own.get(method) or (common[0] if common and drafts else None)


def parse_acceptance(text: str | None) -> SetAcceptance | None:
    """`synthetic:RATE` (one rate in (0, 1]) or `profile:FILE` (a speculation_profile.json's
    conditional_accept_rates, as `report --export specdec-bench` and NVIDIA's specdec_bench write it)."""
    if text is None:
        return None
    kind, _, value = text.partition(":")
    if kind == "synthetic":
        try:
            rate = float(value)
        except ValueError:
            rate = math.nan
        if not 0 < rate <= 1:
            raise UsageError(f"--acceptance {text}: the rate must be a number in (0, 1]")
        return SetAcceptance((rate,), f"synthetic:{rate:g}")
    if kind == "profile":
        return SetAcceptance(profile_rates(Path(value).expanduser()), f"profile:{Path(value).expanduser().resolve()}")
    raise UsageError(f"bad --acceptance '{text}': expected synthetic:RATE or profile:FILE")


def profile_rates(path: Path) -> tuple[float, ...]:
    """The per-position conditional accept rates of a speculation_profile.json, checked."""
    try:
        rates = json.loads(path.read_text())["conditional_accept_rates"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        why = "no conditional_accept_rates" if isinstance(err, (KeyError, TypeError)) else str(err).splitlines()[0]
        raise UsageError(f"--acceptance profile:{path}: unreadable speculation profile ({why})") from None
    if (not isinstance(rates, list) or not rates
            or not all(isinstance(r, (int, float)) and not isinstance(r, bool) and 0 <= r <= 1 for r in rates)):
        raise UsageError(f"--acceptance profile:{path}: conditional_accept_rates must be a non-empty list of rates "
                         "in [0, 1]")
    return tuple(float(r) for r in rates)


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
    engine = check_engine(config, env)
    spec = get_model_spec(config.model, config.target)
    config = dataclasses.replace(config, model=spec.name)  # a random target's model is named for it
    everything = load_dataset(config.dataset)
    chosen = select(everything, config.categories, config.limit)
    shard = parse_shard(config.shard, env)
    prompts = chosen[shard[0]::shard[1]]
    if not prompts:
        raise UsageError("no prompts selected (check --category, --limit and --shard)")
    if config.batch_size > len(prompts):  # the batch could never fill: its throughput would not be batch B's
        raise UsageError(f"--batch-size {config.batch_size} is more than the {len(prompts)} prompt(s) selected, so "
                         "the batch could never fill; lower it or select more prompts")
    if config.compile and config.device == "split":
        raise UsageError("--compile runs on one device: --device split is for acceptance studies of one sequence")
    if config.batch_size > 1 and config.device == "split":
        raise UsageError("--batch-size > 1 runs on one device: --device split is for acceptance studies of one sequence")
    out = config.out or config.results_root / default_name(config, shard)
    if out.exists() and not config.resume:
        raise UsageError(f"results directory {out} exists; pass --resume to continue it or --out for a new one")
    if config.resume and not (out / "run.json").is_file():
        raise UsageError(f"--resume: no run to continue at {out}")
    return Plan(config, spec, prompts, warmup_prompts(everything, prompts, config.warmup), shard, out,
                parse_buckets(config.compile_buckets), engine=engine,
                acceptance=parse_acceptance(acceptance_for(config.acceptance, config.method, [config.method])))


def check_engine(config: RunConfig, env: dict[str, str]) -> EnginePlan | None:
    """--engine and what goes with it: the load the engine takes (the other one stays 1), then the engine's own
    checks (its registry entry's `check`); returns the engine's plan so far, None for our engine."""
    for setting, (_, option) in LOADS.items():
        at_least(option, getattr(config, setting), 1)
    check_load(config.engine, {setting: getattr(config, setting) > 1 for setting in LOADS})
    return load(engine_entry(config.engine).check)(config, env)


def check_load(engine: str, above_one: dict[str, bool]) -> str:
    """The load setting --engine takes (its registry entry's `load`; an unknown engine: one line with the known
    ones), refusing in one line another load set above 1 (`above_one`: setting -> whether it is)."""
    entry = engine_entry(engine)
    for setting, given in above_one.items():
        if setting != entry.load and given:
            raise UsageError(f"{LOADS[setting][1]} is not --engine {engine}'s: {entry.load_about}")
    return entry.load


# The loads a run can be swept over, one run per level: the setting, its folder tag (name suffix _<tag><N>, or
# <out>/<tag><N>) and its option.
LOADS = {"concurrency": ("c", "--concurrency"), "batch_size": ("b", "--batch-size")}


def parse_levels(text: str, option: str = "--concurrency") -> list[int]:
    """A load option: one level or a comma list (`1,2,4,8`), each a positive whole number, in the order given."""
    try:
        levels = [int(part) for part in text.split(",")]  # an empty part ("1,,2") is bad input, not skipped
    except ValueError:
        levels = []
    if not levels or min(levels) < 1 or len(set(levels)) < len(levels):
        raise UsageError(f"{option} '{text}': expected distinct positive whole numbers such as 1 or 1,2,4,8")
    return levels


def level_configs(config: RunConfig, levels: list[int], load: str = "concurrency") -> list[RunConfig]:
    """One run per level of `load` (a LOADS key): each its own results folder (the default name ends in _c<N> or
    _b<N>), or with several levels and --out, <out>/c<N> (b<N>), so that `specbench report <out>` reads the whole
    sweep."""
    if len(levels) == 1:
        return [dataclasses.replace(config, **{load: levels[0]})]
    tag = LOADS[load][0]
    return [dataclasses.replace(config, **{load: n}, out=config.out / f"{tag}{n}" if config.out else None)
            for n in levels]


def default_name(c: RunConfig, shard: tuple[int, int]) -> str:
    tag = engine_entry(c.engine).tag
    engine = f"{tag}-" if tag else ""
    concurrency = "".join(f"_{tag}{getattr(c, load)}" for load, (tag, _) in LOADS.items() if getattr(c, load) > 1)
    name = f"{c.model.replace(':', '-')}_{dataset_slug(c.dataset)}_{engine}{c.method}{'-tuned' if c.tuned else ''}{concurrency}_t{c.temperature:g}"
    return name + (f"_shard{shard[0]}of{shard[1]}" if shard[1] > 1 else "")


def parse_buckets(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] < 1:
        raise UsageError(f"--compile-buckets '{text}': expected comma-separated positive sizes such as 1,8,32,128")
    return sizes


def use_threads(threads: int | None) -> None:
    """--threads (checked >= 1 by each command before anything heavy): torch's intra-op CPU threads. Torch is
    imported here, after the checks."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
