"""`specbench run`: check the inputs, load the target and method, decode the selected prompts turn by turn,
write records as each prompt finishes, and print the summary table.

Everything that can be checked without loading a model is checked first (`plan`), so bad input costs
nothing. The results directory is never overwritten: an existing one needs `--resume`, which continues it
with the same settings and gives the same records an uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from methods.checkpoints import weights_id
from specbench_cli.core.method import Method, drafter_ref, parse_options
from specbench_cli import hardware
from specbench_cli.telemetry import GpuTelemetry
from specbench_cli.datasets import Prompt
from specbench_cli.core.engine import decode_turn
from specbench_cli.core.turn import DecodeSettings, TurnResult
from specbench_cli.core.errors import UsageError
from specbench_cli.folders import claim
from specbench_cli.analysis.metrics import tau
from specbench_cli.inputs import RunConfig, Selection, check_run
from specbench_cli.loading import LoadedModel, load_model, resolve_device, resolve_dtype
from specbench_cli.models import ModelSpec, checkpoint_ref
from specbench_cli.registry import method_class
from specbench_cli.records import NAN, PromptRecord, RoundRecord, RunWriter, output_hash, read_table
from specbench_cli.analysis.summary import print_summary
from specbench_cli.core.target import DEFAULT_BUCKETS, Target
from specbench_cli.core.timing import PHASES, SUB_PHASES, PhaseClock

# Settings that must match for --resume to continue a run.
RESUME_KEYS = ("method", "model", "dataset", "categories", "limit", "shard", "max_new_tokens", "temperature",
               "seed", "dtype", "options", "target", "drafters", "warmup", "compile")
LEGACY = {"compile": None}  # what a setting meant in runs written before it existed
TEMPLATE_MARGIN = 64  # chat-template tokens per turn beyond the joined turns' (role headers, end-of-turn)


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


def plan(config: RunConfig, env: dict[str, str], chosen: Selection | None = None) -> Plan:
    """`check_run`'s checks (unless the caller ran them: `chosen`), then those that need the method's code or
    torch; no model loads here."""
    chosen = chosen or check_run(config, env)
    cls = method_class(config.method)
    options = parse_options(cls, config.opts)
    drafters = _parse_drafters(config.drafters, cls)
    for name in cls.drafter_names:
        drafter_ref(cls, chosen.spec, drafters, name)  # a missing drafter is reported before anything loads
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    mode = ("reduce-overhead" if device.type == "cuda" else "inductor") if config.compile else None
    return Plan(config, cls, options, chosen.spec, chosen.prompts, chosen.warmup, chosen.shard, device, dtype,
                chosen.out, drafters, mode, chosen.buckets)


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


# ---------------------------------------------------------------------------------------------- running
class Runner:
    def __init__(self, plan: Plan, model: LoadedModel) -> None:
        self.plan = plan
        self.model = model
        self.target = Target(model.model, model.device, plan.compile_mode, plan.buckets)
        self.method: Method = plan.method_cls(plan.options, model, plan.drafters)
        self.settings = DecodeSettings(plan.config.max_new_tokens, plan.config.temperature, model.stop_ids)
        self.run_name = plan.out.name

    def compile(self, longest: int, also: tuple[Method, ...] = ()) -> dict:
        """Size the cache for `longest` positions (`check_lengths`' answer) and compile every bucket, before
        anything is timed (`also`: further methods whose captured layers the graphs must return, e.g. the
        oracle's replayers)."""
        if self.plan.compile_mode is None:
            return {}
        self.target.plan(longest)
        for method in (self.method, *also):  # captured layers and reserved entries are part of the graph
            method.attach(self.target)
        seconds = self.target.warm_up()
        return {"mode": self.plan.compile_mode, "buckets": list(self.plan.buckets), "capacity": self.target.kv.capacity,
                "seconds": {str(k): round(v, 2) for k, v in seconds.items()}}

    def tokens_needed(self, prompt: Prompt) -> int:
        """An upper bound on the positions a prompt fills: all its turns (chat template applied) plus, per turn,
        an answer of --max-new-tokens and the template's own tokens."""
        turns = len(self.model.encode_chat([{"role": "user", "content": "\n".join(prompt.turns)}]))
        return turns + len(prompt.turns) * (self.plan.config.max_new_tokens + TEMPLATE_MARGIN)

    def check_lengths(self) -> int:
        """The stated rule for prompts that do not fit: a prompt whose `tokens_needed` exceeds the model's
        context (max_position_embeddings) is refused before anything decodes; nothing is truncated. Returns the
        most positions any selected prompt needs (what a compiled cache is sized for)."""
        context = getattr(self.model.model.config, "max_position_embeddings", None)
        longest = 0
        for prompt in (*self.plan.warmup, *self.plan.prompts):
            need = self.tokens_needed(prompt)
            longest = max(longest, need)
            if context is not None and need > context:
                raise UsageError(f"prompt '{prompt.id}' needs up to {need} positions ({len(prompt.turns)} turn(s) plus "
                                 f"--max-new-tokens {self.plan.config.max_new_tokens} each) but {self.plan.spec.name}'s "
                                 f"context is {context}; lower --max-new-tokens, or leave the prompt out")
        return longest

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
                                     tau=tau(decode_tokens, len(r.rounds)), stop_reason=r.stop_reason,
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
    """Take the results folder (one writer per folder), then record the run and print its summary."""
    with claim(plan.out, plan.config.resume, lambda line: console.print(line, highlight=False)):
        _record(plan, console)
    print_summary(plan.out, console)
    return plan.out


def _record(plan: Plan, console: Console) -> None:
    writer = RunWriter(plan.out)
    gpu = GpuTelemetry(plan.device)
    session = {"started": dt.datetime.now().isoformat(timespec="seconds"),
               "environment": {**hardware.environment(plan.device), **gpu.info()}}
    weights = drafter_weights(plan)
    info = _resumed_info(plan, session["environment"], weights) if plan.config.resume else None
    done = writer.finished() if info else set()
    split = plan.config.device == "split"
    model = load_model(plan.spec, plan.device, plan.dtype, split)
    runner = Runner(plan, model)
    longest = runner.check_lengths()  # a prompt past the model's context is refused before anything decodes
    if info is None:
        info = {"settings": plan.settings(), "method_class": f"{plan.method_cls.__module__}.{plan.method_cls.__name__}",
                "inherent_syncs": plan.method_cls.inherent_syncs, "clock": PhaseClock(plan.device).name,
                "environment": session["environment"], "prompts_selected": len(plan.prompts),
                "started": session["started"], "weight_bytes": hardware.weight_bytes(model.model),
                "drafter_weights": weights, "sessions": []}
        if split:
            info["device_map"] = getattr(model.model, "hf_device_map", "auto")  # for acceptance studies only
    info.update(status="running", sessions=[*info["sessions"], session])
    writer.create(info)
    if plan.compile_mode is not None:
        info["compile"] = runner.compile(longest)  # compile time is reported here and never enters a timed round
        writer.write_json("run.json", info)

    if plan.warmup and plan.warmup[0].dataset == "builtin":
        console.print("warm-up: every prompt of the dataset is scored, so a built-in prompt warms up", highlight=False)
    for prompt in plan.warmup:  # run, not recorded; cross-prompt state (suffix cache) keeps their outputs
        runner.decode_prompt(prompt)
    _replay_finished(runner, writer, done)

    gpu.start()
    tokens = _decode_selection(runner, writer, [(i, p) for i, p in enumerate(plan.prompts) if i not in done], console)
    if runner.target.late_compiles:
        info["compile"]["late"] = runner.target.late_compiles  # sizes past every bucket: compiled inside a round
    session.update(finished=dt.datetime.now().isoformat(timespec="seconds"), prompts=len(plan.prompts) - len(done),
                   tokens=tokens, **hardware.peak_memory(plan.device), **gpu.stop(tokens))  # energy: this session's
    info.update(status="complete", finished=session["finished"], **_run_totals(info["sessions"]))
    writer.write_json("run.json", info)


# Environment facts that change what a timing means: a resume must keep them.
MEASURED = ("device", "cpu", "gpu", "torch_threads")


def drafter_weights(plan: Plan) -> dict[str, str]:
    """Which weights each drafter the method loads has (`checkpoints.weights_id`: a local folder's fingerprint, a
    calibration's with its config.json, whose thresholds decide, or a hub id with its commit). Optional drafters
    count when passed or registered (DART's trie, whiflash-entropy's thresholds unless `--opt threshold` stands in
    for them). Recorded in run.json so that two runs with other drafter weights under the same settings (a
    retrained drafter or a recalibrated router at the registered path, a hub repo that moved on) never merge into
    one report row, and a resume cannot mix them."""
    cls = plan.method_cls
    unread = set() if cls.reads_calibration(plan.options) else {cls.calibration}
    optional = [n for n in cls.optional_drafters if (n in plan.drafters or n in plan.spec.drafters) and n not in unread]
    refs = {name: drafter_ref(cls, plan.spec, plan.drafters, name) for name in [*cls.drafter_names, *optional]}
    once = functools.cache(weights_id)  # DART's draft and trie often share one folder: read it once
    return {name: once(ref, ("config.json",) if name == cls.calibration else ()) for name, ref in refs.items()}


def _resumed_info(plan: Plan, environment: dict, weights: dict[str, str]) -> dict:
    """run.json of the run being resumed, after checking that this session measures the same thing."""
    info = json.loads((plan.out / "run.json").read_text())
    settings = json.loads(json.dumps(plan.settings()))
    changed = [k for k in RESUME_KEYS if info.get("settings", {}).get(k, LEGACY.get(k)) != settings[k]]
    if changed:
        raise UsageError(f"--resume: {plan.out} was run with different settings ({', '.join(changed)})")
    recorded = info.get("drafter_weights", weights)  # runs written before weights were recorded: not checked
    if recorded != weights:
        changed = sorted(n for n in {*recorded, *weights} if recorded.get(n) != weights.get(n))
        raise UsageError(f"--resume: the {', '.join(changed)} drafter weights differ from those {plan.out} was run "
                         f"with; start a new --out for the new weights")
    before = info.get("environment", {})
    moved = [f"{k} {before.get(k)} -> {environment.get(k)}" for k in MEASURED if before.get(k) != environment.get(k)]
    if moved:
        raise UsageError(f"--resume: {plan.out} was measured differently ({'; '.join(moved)}); resume it with the same "
                         f"machine and --threads, or start a new --out")
    if "sessions" not in info:  # a run written before sessions were kept: its first session is the top level
        info["sessions"] = [{k: info[k] for k in ("started", "finished", "environment", "peak_rss_mb", "energy_j")
                             if k in info}]
    return info


def _run_totals(sessions: list[dict]) -> dict:
    """Top-level memory and energy of a run made of sessions: the peak over sessions, the summed energy."""
    totals = {k: max(s[k] for s in sessions if k in s) for k in ("peak_rss_mb", "cuda_max_allocated_mb",
                                                                  "cuda_max_reserved_mb") if any(k in s for s in sessions)}
    if all("energy_j" in s and "tokens" in s for s in sessions):
        joules, tokens = sum(s["energy_j"] for s in sessions), sum(s["tokens"] for s in sessions)
        totals.update(energy_j=round(joules, 3), energy_per_token_j=round(joules / tokens, 6) if tokens else None)
    return totals


def _decode_selection(runner: Runner, writer: RunWriter, todo: list[tuple[int, Prompt]], console: Console) -> int:
    """Decode and write the prompts still to do; returns the tokens generated.

    The bar's time estimate counts turns, not prompts (prompts differ in turns and length): turns left x the
    mean wall time of a turn so far, i.e. the tokens still expected at the mean tokens per turn, over the
    token rate so far. Its tok/s pools every token of the session (decode time only); the summary's is the mean
    of per-prompt rates, and is labelled so."""
    plan = runner.plan
    turns_left = sum(len(p.turns) for _, p in todo)
    with progress_bar(console, remaining=False) as bar:
        task = bar.add_task(f"{plan.config.method} on {plan.config.dataset}", total=len(plan.prompts),
                            completed=len(plan.prompts) - len(todo), stats="")
        generated = decode_tokens = rounds = decode_s = turns_done = 0
        started = time.perf_counter()
        for index, prompt in todo:
            turns = runner.decode_prompt(prompt)
            writer.write_prompt(index, *runner.records(index, prompt, turns))
            generated += sum(len(r.output_ids) for _, r in turns)
            decode_tokens += sum(len(r.output_ids) - 1 for _, r in turns)  # the first token is the prefill's
            rounds += sum(len(r.rounds) for _, r in turns)
            decode_s += sum(r.decode_ms for _, r in turns) / 1e3
            turns_done += len(turns)
            left = (turns_left - turns_done) * (time.perf_counter() - started) / turns_done
            bar.update(task, advance=1, stats=f"τ {tau(decode_tokens, rounds):.2f}  "
                                              f"{decode_tokens / max(decode_s, 1e-9):.1f} tok/s pooled  ~{_clock(left)} left")
    return generated


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


def _replay_finished(runner: Runner, writer: RunWriter, done: set[int]) -> None:
    """On resume, feed the finished prompts' outputs to the method in their original order."""
    if not done:
        return
    table = read_table(writer.dir, "prompts").sort_values(["index", "turn"])
    for ids in table.output_ids:
        runner.method.absorb([int(t) for t in ids])


def progress_bar(console: Console, remaining: bool = True) -> Progress:
    """The one rich progress bar layout (description, bar, n/total, live stats, elapsed and, unless the caller
    estimates it itself, rich's time remaining)."""
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[stats]}"), TimeElapsedColumn()]
    return Progress(*columns, *([TimeRemainingColumn()] if remaining else []), console=console)
