"""`specbench run`: check the inputs, load the target and method, decode the selected prompts turn by turn,
write records as each prompt finishes, and print the summary table.

Everything that can be checked without loading a model is checked first (`plan`), so bad input costs
nothing. The results directory is never overwritten: an existing one needs `--resume`, which continues it
with the same settings and gives the same records an uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from methods import method_class
from specbench_cli.core.method import Method, drafter_ref, parse_options
from specbench_cli import hardware
from specbench_cli.telemetry import GpuTelemetry
from specbench_cli.datasets import Prompt, load_dataset, parse_shard, select
from specbench_cli.core.engine import decode_turn
from specbench_cli.core.turn import DecodeSettings, TurnResult
from specbench_cli.core.errors import UsageError
from specbench_cli.models import (LoadedModel, ModelSpec, checkpoint_ref, get_model_spec, load_model, resolve_device,
                                  resolve_dtype)
from specbench_cli.records import NAN, PromptRecord, RoundRecord, RunWriter, output_hash, read_table
from specbench_cli.summary import print_summary
from specbench_cli.core.target import DEFAULT_BUCKETS, Target
from specbench_cli.core.timing import PHASES, SUB_PHASES, PhaseClock

# Settings that must match for --resume to continue a run.
RESUME_KEYS = ("method", "model", "dataset", "categories", "limit", "shard", "max_new_tokens", "temperature",
               "seed", "dtype", "options", "target", "drafters", "warmup", "compile")
LEGACY = {"compile": None}  # what a setting meant in runs written before it existed


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
    compile_buckets: str = ",".join(map(str, DEFAULT_BUCKETS))


@dataclass
class Plan:
    """A checked run: everything but the loaded model."""

    config: RunConfig
    method_cls: type
    options: object
    spec: ModelSpec
    prompts: list[Prompt]
    warmup: list[Prompt]
    shard: tuple[int, int]
    device: torch.device
    dtype: torch.dtype
    out: Path
    drafters: dict[str, str]
    compile_mode: str | None = None  # None = eager; "reduce-overhead" (CUDA graphs) on GPU, "inductor" on CPU
    buckets: tuple[int, ...] = DEFAULT_BUCKETS

    def settings(self) -> dict:
        c = self.config
        return {"method": c.method, "model": c.model, "dataset": c.dataset, "categories": c.categories,
                "limit": c.limit, "shard": f"{self.shard[0]}/{self.shard[1]}", "max_new_tokens": c.max_new_tokens,
                "temperature": c.temperature, "seed": c.seed, "dtype": str(self.dtype).removeprefix("torch."),
                "options": dataclasses.asdict(self.options), "target": self.spec.target, "drafters": self.drafters,
                "warmup": [p.id for p in self.warmup],
                "compile": None if self.compile_mode is None else {"mode": self.compile_mode, "buckets": list(self.buckets)}}


def plan(config: RunConfig, env: dict[str, str]) -> Plan:
    if config.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be at least 1")
    if config.temperature < 0:
        raise UsageError("--temperature must be >= 0")
    cls = method_class(config.method)
    options = parse_options(cls, config.opts)
    drafters = _parse_drafters(config.drafters, cls)
    spec = get_model_spec(config.model, config.target)
    for name in cls.drafter_names:
        drafter_ref(cls, spec, drafters, name)  # a missing drafter is reported before anything loads
    everything = load_dataset(config.dataset)
    chosen = select(everything, config.categories, config.limit)
    shard = parse_shard(config.shard, env)
    prompts = chosen[shard[0]::shard[1]]
    if not prompts:
        raise UsageError("no prompts selected (check --category, --limit and --shard)")
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    out = config.out or config.results_root / _default_name(config, shard)
    if out.exists() and not config.resume:
        raise UsageError(f"results directory {out} exists; pass --resume to continue it or --out for a new one")
    if config.resume and not (out / "run.json").exists():
        raise UsageError(f"--resume: no run to continue at {out}")
    mode = ("reduce-overhead" if device.type == "cuda" else "inductor") if config.compile else None
    return Plan(config, cls, options, spec, prompts, _warmup_prompts(everything, prompts, config.warmup),
                shard, device, dtype, out, drafters, mode, parse_buckets(config.compile_buckets))


def parse_buckets(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] < 1:
        raise UsageError(f"--compile-buckets '{text}': expected comma-separated positive sizes such as 1,8,32,128")
    return sizes


def _parse_drafters(pairs: list[str], cls: type) -> dict[str, str]:
    drafters = {}
    accepted = (*cls.drafter_names, *cls.optional_drafters)
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"malformed --drafter '{pair}': expected NAME=PATH")
        if name not in accepted:
            raise UsageError(f"method {cls.name} has no drafter '{name}'" + (f" (it takes: {', '.join(accepted)})" if accepted else ""))
        drafters[name] = checkpoint_ref(path, "drafter")
    return drafters


def _default_name(c: RunConfig, shard: tuple[int, int]) -> str:
    name = f"{c.model}_{Path(c.dataset).stem}_{c.method}_t{c.temperature:g}"
    return name + (f"_shard{shard[0]}of{shard[1]}" if shard[1] > 1 else "")


def _warmup_prompts(everything: list[Prompt], scored: list[Prompt], n: int) -> list[Prompt]:
    """Warm-up prompts come from the same dataset but outside the scored ones, so they never inflate a score."""
    scored_ids = {p.id for p in scored}
    spare = [p for p in everything if p.id not in scored_ids]
    return (spare or everything)[:n]


# ---------------------------------------------------------------------------------------------- running
class Runner:
    def __init__(self, plan: Plan, model: LoadedModel) -> None:
        self.plan = plan
        self.model = model
        self.target = Target(model.model, model.device, plan.compile_mode, plan.buckets)
        self.method: Method = plan.method_cls(plan.options, model, plan.drafters)
        self.settings = DecodeSettings(plan.config.max_new_tokens, plan.config.temperature, model.stop_ids)
        self.run_name = plan.out.name

    def compile(self, also: tuple[Method, ...] = ()) -> dict:
        """Size the cache for the longest selected prompt and compile every bucket, before anything is timed
        (`also`: further methods whose captured layers the graphs must return, e.g. the oracle's replayers)."""
        if self.plan.compile_mode is None:
            return {}
        n = self.plan.config.max_new_tokens
        longest = max(len(self.model.encode_chat([{"role": "user", "content": "\n".join(p.turns)}]))
                      + len(p.turns) * (n + 64) for p in (*self.plan.prompts, *self.plan.warmup))
        self.target.plan(longest)
        for method in (self.method, *also):  # captured layers and reserved entries are part of the graph
            method.attach(self.target)
        seconds = self.target.warm_up()
        return {"mode": self.plan.compile_mode, "buckets": list(self.plan.buckets), "capacity": self.target.kv.capacity,
                "seconds": {str(k): round(v, 2) for k, v in seconds.items()}}

    def decode_prompt(self, prompt: Prompt) -> list[tuple[list[int], TurnResult]]:
        """All turns of a prompt, each turn seeing the model's own earlier answers."""
        messages, turns = [], []
        for t, text in enumerate(prompt.turns):
            messages.append({"role": "user", "content": text})
            ids = self.model.encode_chat(messages)
            result = decode_turn(self.target, self.method, ids, self.settings, self._generator(prompt, t), prompt.category)
            messages.append({"role": "assistant", "content": self.model.decode(result.output_ids)})
            turns.append((ids, result))
        return turns

    def _generator(self, prompt: Prompt, turn: int) -> torch.Generator:
        """A per-turn seed, so a resumed or sharded run draws the same samples as a whole one."""
        seed = zlib.crc32(f"{self.plan.config.seed}/{prompt.dataset}/{prompt.id}/{turn}".encode())
        return torch.Generator(device=self.model.device).manual_seed(seed)

    def records(self, index: int, prompt: Prompt, turns: list[tuple[list[int], TurnResult]]):
        c, clock = self.plan.config, PhaseClock(self.model.device).name
        common = dict(run=self.run_name, method=c.method, model=c.model, dataset=prompt.dataset,
                      category=prompt.category, subtask=prompt.subtask, prompt_id=prompt.id)
        rounds, rows = [], []
        for t, (ids, r) in enumerate(turns):
            decode_tokens = len(r.output_ids) - 1
            rows.append(PromptRecord(**common, turn=t, index=index, prompt_tokens=len(ids),
                                     new_tokens=len(r.output_ids), decode_tokens=decode_tokens, rounds=len(r.rounds),
                                     ttft_ms=r.ttft_ms, decode_ms=r.decode_ms,
                                     tokens_per_s=decode_tokens / (r.decode_ms / 1e3) if r.decode_ms > 0 else NAN,
                                     tau=decode_tokens / len(r.rounds) if r.rounds else NAN, stop_reason=r.stop_reason,
                                     clock=clock if not self.method.owns_loop else "perf_counter_ns (streamer)",
                                     output_hash=output_hash(r.output_ids), output_text=self.model.decode(r.output_ids),
                                     output_ids=r.output_ids, prompt_ids=ids))
            for k, info in enumerate(r.rounds):
                ms = {f"{p}_ms": info.phases.get(p, NAN) for p in (*PHASES, *SUB_PHASES, "wall")}
                rounds.append(RoundRecord(**common, turn=t, round=k, proposer=info.proposer, tree_size=info.tree_size,
                                          draft_depth=info.draft_depth, accepted=info.accepted, emitted=info.emitted,
                                          kv_len=info.kv_len, target_forwards=info.target_forwards, backlog=info.backlog,
                                          entropy=info.entropy, router_score=info.router_score,
                                          features=",".join(f"{v:.6g}" for v in info.features), **ms))
        return rounds, rows


def execute(plan: Plan, console: Console) -> Path:
    writer = RunWriter(plan.out)
    settings = plan.settings()
    if plan.config.resume:
        previous = json.loads((plan.out / "run.json").read_text())
        changed = [k for k in RESUME_KEYS
                   if previous.get("settings", {}).get(k, LEGACY.get(k)) != json.loads(json.dumps(settings[k]))]
        if changed:
            raise UsageError(f"--resume: {plan.out} was run with different settings ({', '.join(changed)})")
        done = writer.finished()
    else:
        done = set()
    split = plan.config.device == "split"
    model = load_model(plan.spec, plan.device, plan.dtype, split)
    runner = Runner(plan, model)
    gpu = GpuTelemetry(plan.device)
    info = {"settings": settings, "method_class": f"{plan.method_cls.__module__}.{plan.method_cls.__name__}",
            "inherent_syncs": plan.method_cls.inherent_syncs, "clock": PhaseClock(plan.device).name,
            "environment": {**hardware.environment(plan.device), **gpu.info()}, "prompts_selected": len(plan.prompts),
            "started": dt.datetime.now().isoformat(timespec="seconds"), "status": "running",
            "weight_bytes": hardware.weight_bytes(model.model)}
    if split:
        info["device_map"] = getattr(model.model, "hf_device_map", "auto")  # for acceptance studies only
    if plan.config.resume:
        info["resumed"] = True
    writer.create(info)
    if plan.compile_mode is not None:
        info["compile"] = runner.compile()  # compile time is reported here and never enters a timed round
        writer.write_json("run.json", info)

    for prompt in plan.warmup:  # run, not recorded; cross-prompt state (suffix cache) keeps their outputs
        runner.decode_prompt(prompt)
    _replay_finished(runner, writer, done)

    todo = [(i, p) for i, p in enumerate(plan.prompts) if i not in done]
    with progress_bar(console) as bar:
        task = bar.add_task(f"{plan.config.method} on {plan.config.dataset}", total=len(plan.prompts),
                            completed=len(plan.prompts) - len(todo), stats="")
        toks = rounds = secs = 0.0  # running totals over this session's prompts, for the bar
        gpu.start()
        for index, prompt in todo:
            turns = runner.decode_prompt(prompt)
            writer.write_prompt(index, *runner.records(index, prompt, turns))
            toks += sum(len(r.output_ids) - 1 for _, r in turns)
            rounds += sum(len(r.rounds) for _, r in turns)
            secs += sum(r.decode_ms for _, r in turns) / 1e3
            bar.update(task, advance=1, stats=f"τ {toks / max(rounds, 1):.2f}  {toks / max(secs, 1e-9):.1f} tok/s")

    if runner.target.late_compiles:
        info["compile"]["late"] = runner.target.late_compiles  # sizes past every bucket: compiled inside a round
    info.update(status="complete", finished=dt.datetime.now().isoformat(timespec="seconds"),
                **hardware.peak_memory(plan.device), **gpu.stop(int(toks)))  # energy: this session's prompts
    writer.write_json("run.json", info)
    print_summary(plan.out, console)
    return plan.out


def _replay_finished(runner: Runner, writer: RunWriter, done: set[int]) -> None:
    """On resume, feed the finished prompts' outputs to the method in their original order."""
    if not done:
        return
    table = read_table(writer.dir, "prompts").sort_values(["index", "turn"])
    for ids in table.output_ids:
        runner.method.absorb([int(t) for t in ids])


def progress_bar(console: Console) -> Progress:
    """The one rich progress bar layout (description, bar, n/total, live stats, times)."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=console)
