"""`specbench run`: check the inputs, load the target and method, decode the selected prompts turn by turn,
write records as each prompt finishes, and print the summary table.

Everything that can be checked without loading a model is checked first (`plan`), so bad input costs
nothing. The results directory is never overwritten: an existing one needs `--resume`, which continues it
with the same settings and gives the same records an uninterrupted run would have.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import time
import zlib
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from methods.checkpoints import weights_id
from specbench_cli.core.method import Method, OwnLoop, drafter_ref
from specbench_cli.core.options import parse_options
from specbench_cli import hardware
from specbench_cli.telemetry import GpuTelemetry
from specbench_cli.datasets import Prompt
from specbench_cli.conversations import Conversation, Throughput
from specbench_cli.core.engine import Turn, decode, decode_turn
from specbench_cli.core.kernels import packs
from specbench_cli.core.turn import DecodeSettings, TurnResult
from specbench_cli.core.errors import UsageError
from specbench_cli.analysis.metrics import tau
from specbench_cli.inputs import Plan, RunConfig, check_run
from specbench_cli.loading import LoadedModel, load_model, resolve_device, resolve_dtype, resolve_invariant
from specbench_cli.tuning import machine_key, tuned_opts
from specbench_cli.models import checkpoint_ref
from specbench_cli.registry import METHODS, method_class
from specbench_cli.records import NAN, RUN_TABLES, PromptRecord, RoundRecord, output_hash, run_parts
from specbench_cli.run_folder import RunFolder, RunInfo, now
from specbench_cli.analysis.summary import print_summary
from specbench_cli.core.target import Target, TargetModel
from specbench_cli.core.timing import PHASES, SUB_PHASES, PhaseClock

TEMPLATE_MARGIN = 64  # chat-template tokens per turn beyond the joined turns' (role headers, end-of-turn)


def plan(config: RunConfig, env: dict[str, str], chosen: Plan | None = None, cpu_bf16: bool = True) -> Plan:
    """`check_run`'s checks (unless the caller ran them: `chosen`), then those that need the method's code or
    torch; no model loads here. `cpu_bf16=False`: `--dtype auto` stays float32 on the CPU (`resolve_dtype`)."""
    chosen = chosen or check_run(config, env)
    cls = method_class(config.method)
    notes: list[str] = []
    options = parse_options(cls, config.opts, notes)
    drafters = _parse_drafters(config.drafters, cls)
    for name in cls.drafter_names:
        drafter_ref(cls, chosen.spec, drafters, name)  # a missing drafter is reported before anything loads
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device, cpu_bf16)
    mode = ("reduce-overhead" if device.type == "cuda" else "inductor") if config.compile else None
    engine = config.engine == "specbench"
    invariant = engine and resolve_invariant(config.batch_invariant, dtype.dtype, device, compiled=mode is not None)
    tuned_from = ""
    if config.tuned:  # the tuned budget first, so that an explicit --opt still wins
        machine = machine_key(dtype.dtype, device, torch.get_num_threads(), invariant)
        opts, record = tuned_opts(chosen.spec.name, config.method, machine)
        options, tuned_from = parse_options(cls, [*opts, *config.opts], notes), str(record)
        notes.append(f"tuned budget {' '.join(opts) or '(the paper default)'} from {record}")
    planned = dataclasses.replace(chosen, method_cls=cls, options=options, drafters=drafters, device=device,
                                  dtype=dtype.dtype, dtype_reason=dtype.reason, tuned_from=tuned_from,
                                  compile_mode=mode, batch_invariant=invariant, notes=notes,
                                  prepacked=engine and packs(device, dtype.dtype, compiled=mode is not None))
    if config.batch_size > 1 and issubclass(cls, OwnLoop):
        raise UsageError(f"{config.method} runs its own loop, one sequence at a time; --batch-size > 1 runs every "
                         "other method")
    if config.engine == "vllm":
        from specbench_cli.engines.vllm import plan_engine

        planned = plan_engine(planned)
    return planned


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


def tokens_needed(plan: Plan, model: LoadedModel, prompt: Prompt) -> int:
    """An upper bound on the positions a prompt fills: all its turns (chat template applied) plus, per turn,
    an answer of --max-new-tokens and the template's own tokens."""
    turns = len(model.encode_chat([{"role": "user", "content": "\n".join(prompt.turns)}]))
    return turns + len(prompt.turns) * (plan.config.max_new_tokens + TEMPLATE_MARGIN)


def check_lengths(plan: Plan, model: LoadedModel, context: int | None) -> int:
    """The stated rule for prompts that do not fit: a prompt whose `tokens_needed` exceeds the model's context
    (max_position_embeddings) is refused before anything decodes; nothing is truncated. Returns the most
    positions any selected prompt needs (what a compiled cache is sized for)."""
    longest = 0
    for prompt in (*plan.warmup, *plan.prompts):
        need = tokens_needed(plan, model, prompt)
        longest = max(longest, need)
        if context is not None and need > context:
            raise UsageError(f"prompt '{prompt.id}' needs up to {need} positions ({len(prompt.turns)} turn(s) plus "
                             f"--max-new-tokens {plan.config.max_new_tokens} each) but {plan.spec.name}'s "
                             f"context is {context}; lower --max-new-tokens, or leave the prompt out")
    return longest


# ---------------------------------------------------------------------------------------------- running
def context(prompt: Prompt) -> dict[str, str]:
    """What a method may know of the prompt it decodes (`DecodeState.context`)."""
    return {"dataset": prompt.dataset, "category": prompt.category, "subtask": prompt.subtask, "prompt_id": prompt.id}


class Runner:
    def __init__(self, plan: Plan, model: LoadedModel) -> None:
        self.plan = plan
        self.model = model
        self.target = Target(model.model, model.device, plan.compile_mode, plan.buckets, plan.batch_invariant,
                             packed=plan.prepacked)
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
        return compile_record(self.plan, self.target.kv.capacity, self.target.warm_up())

    def check_lengths(self) -> int:
        return check_lengths(self.plan, self.model, getattr(self.model.model.config, "max_position_embeddings", None))

    def decode_prompt(self, prompt: Prompt) -> list[tuple[list[int], TurnResult]]:
        """All turns of a prompt, each turn seeing the model's own earlier answers."""
        conv = Conversation(0, prompt)
        while not conv.finished:
            turn = self.next_turn(conv)
            conv.add(decode_turn(self.target, self.method, turn.prompt_ids, self.settings, turn.generator, turn.context),
                     self.model)
        return conv.turns

    def next_turn(self, conv: Conversation) -> Turn:
        """What decoding a conversation's next turn takes: its ids, its own generator, the prompt's context."""
        generator = torch.Generator(device=self.model.device).manual_seed(
            turn_seed(self.plan.config.seed, conv.prompt, conv.turn))
        return Turn(conv.next_ids(self.model), generator, context(conv.prompt))

    def records(self, index: int, prompt: Prompt, turns: list[tuple[list[int], TurnResult]]):
        clock = PhaseClock(self.model.device).name if not isinstance(self.method, OwnLoop) else "perf_counter_ns (streamer)"
        return turn_records(self.plan, self.run_name, clock, self.model.decode, index, prompt, turns)


def turn_seed(seed: int, prompt: Prompt, turn: int) -> int:
    """A per-turn seed, so a resumed or sharded run (in any engine) draws the same samples as a whole one."""
    return zlib.crc32(f"{seed}/{prompt.dataset}/{prompt.id}/{turn}".encode())


def turn_records(plan: Plan, run_name: str, clock: str, decode_text, index: int, prompt: Prompt,
                 turns: list[tuple[list[int], TurnResult]], engine: str = "specbench"):
    """A decoded prompt's rows: one `PromptRecord` per turn, one `RoundRecord` per round (any engine's turns)."""
    c = plan.config
    common = dict(run=run_name, method=c.method, model=c.model, dataset=prompt.dataset,
                  category=prompt.category, subtask=prompt.subtask, prompt_id=prompt.id)
    rounds, rows = [], []
    for t, (ids, r) in enumerate(turns):
        decode_tokens = len(r.output_ids) - 1
        rows.append(PromptRecord(**common, turn=t, index=index, prompt_tokens=len(ids),
                                 new_tokens=len(r.output_ids), decode_tokens=decode_tokens, rounds=len(r.rounds),
                                 ttft_ms=r.ttft_ms, decode_ms=r.decode_ms,
                                 tokens_per_s=decode_tokens / (r.decode_ms / 1e3) if r.decode_ms > 0 else NAN,
                                 tau=tau(decode_tokens, len(r.rounds)), stop_reason=r.stop_reason, clock=clock,
                                 output_hash=output_hash(r.output_ids), output_text=decode_text(r.output_ids),
                                 output_ids=r.output_ids, prompt_ids=ids, engine=engine))
        for k, info in enumerate(r.rounds):
            ms = {f"{p}_ms": info.phases.get(p, NAN) for p in (*PHASES, *SUB_PHASES, "wall")}
            rounds.append(RoundRecord(**common, turn=t, round=k, proposer=info.proposer, tree_size=info.tree_size,
                                      draft_depth=info.draft_depth, accepted=info.accepted, emitted=info.emitted,
                                      kv_len=info.kv_len, target_forwards=info.target_forwards, **ms,
                                      engine=engine, batch_slot=info.slot, batch_size=info.batch,
                                      batch_round=info.batch_round, extras=info.extras))
    return rounds, rows


# ---------------------------------------------------------------------------------------------- the run's life
class PromptJob(Protocol):
    """What a kind of run does with a prompt; `RunFolder`, `warm_up` and `record_prompts` do the rest (the folder,
    resume, warm-up, parts, progress)."""

    def warm_up(self, prompt: Prompt) -> None:
        """Decode a warm-up prompt: not recorded, but cross-prompt state (a suffix cache) keeps its outputs."""

    def absorb(self, output_ids: list[int]) -> None:
        """Take in a finished prompt's turn output on resume, as if it had just been decoded."""

    def decode(self, index: int, prompt: Prompt) -> dict[str, pa.Table]:
        """Decode one prompt of the selection: its rows, one table per name of the folder's tables."""

    def decode_all(self, todo: list[tuple[int, Prompt]], finished: Callable[[int, Prompt, dict], None]) -> None:
        """Decode the prompts `todo`, handing each one's rows to `finished` as soon as it is done (`OneAtATime`:
        in order, with `decode`)."""

    def stats(self) -> str:
        """The progress bar's live text after the latest prompt."""


class OneAtATime:
    """A job that decodes one prompt at a time (`decode`), in the selection's order."""

    def decode_all(self, todo: list[tuple[int, Prompt]], finished: Callable[[int, Prompt, dict], None]) -> None:
        for index, prompt in todo:
            finished(index, prompt, self.decode(index, prompt))


def warm_up(folder: RunFolder, job: PromptJob, plan: Plan, console: Console) -> None:
    """Decode the warm-up prompts, then replay the finished prompts' outputs into the method (resume): cross-prompt
    state then holds what an uninterrupted run's would."""
    if plan.warmup and plan.warmup[0].dataset == "builtin":
        console.print("warm-up: every prompt of the dataset is scored, so a built-in prompt warms up", highlight=False)
    for prompt in plan.warmup:
        job.warm_up(prompt)
    for ids in folder.finished_outputs():
        job.absorb(ids)


def record_prompts(folder: RunFolder, job: PromptJob, plan: Plan, done: set[int], console: Console, label: str) -> None:
    """Decode and write the prompts not yet done, one part per table each."""
    todo = [(i, p) for i, p in enumerate(plan.prompts) if i not in done]
    with record_progress(console, plan, todo, label) as advance:
        def finished(index: int, prompt: Prompt, tables: dict) -> None:
            folder.write_prompt(index, tables)
            advance(prompt, job.stats())

        job.decode_all(todo, finished)


@contextmanager
def record_progress(console: Console, plan: Plan, todo: list[tuple[int, Prompt]], label: str):
    """The progress bar of a run's recorded prompts; yields `advance(prompt, stats)`, called as each finishes.

    The bar's time estimate counts turns, not prompts (prompts differ in turns and length): turns left x the
    mean wall time of a turn so far."""
    turns_left, turns_done = sum(len(p.turns) for _, p in todo), 0
    with progress_bar(console, remaining=False) as bar:
        task = bar.add_task(label, total=len(plan.prompts), completed=len(plan.prompts) - len(todo), stats="")
        started = time.perf_counter()

        def advance(prompt: Prompt, stats: str) -> None:
            nonlocal turns_done
            turns_done += len(prompt.turns)
            left = (turns_left - turns_done) * (time.perf_counter() - started) / turns_done
            bar.update(task, advance=1, stats=f"{stats}  ~{_clock(left)} left".strip())

        yield advance


def new_session(device: torch.device, telemetry: dict | None = None) -> dict:
    return {"started": now(), "environment": {**hardware.environment(device), **(telemetry or {})}}


def loaded_target(plan: Plan, model: LoadedModel | None, split: bool = False) -> LoadedModel:
    """The target, loaded now unless a caller (calibrate, which runs several records on one target) has it."""
    if model is not None and (model.dtype, model.device.type) != (plan.dtype, plan.device.type):
        raise RuntimeError(f"a {model.dtype} target on {model.device} handed to a {plan.dtype} run on {plan.device}")
    return model if model is not None else load_model(plan.spec, plan.device, plan.dtype, split)


# ---------------------------------------------------------------------------------------------- `run`
class RunJob(OneAtATime):
    """`run`'s rows: a prompt decoded by the method -> its rounds and prompts records."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.generated = self.decode_tokens = self.rounds = 0
        self.decode_s = 0.0

    def warm_up(self, prompt: Prompt) -> None:
        self.runner.decode_prompt(prompt)

    def compile(self, longest: int) -> dict:
        """Size the cache and compile every bucket before anything is timed (run.json's `compile`)."""
        return self.runner.compile(longest)

    def late_compiles(self) -> list:
        return self.runner.target.late_compiles

    def absorb(self, output_ids: list[int]) -> None:
        self.runner.method.absorb(output_ids)

    def decode(self, index: int, prompt: Prompt) -> dict[str, pa.Table]:
        return self.tables(index, prompt, self.runner.decode_prompt(prompt))

    def tables(self, index: int, prompt: Prompt, turns: list[tuple[list[int], TurnResult]]) -> dict[str, pa.Table]:
        rounds, rows = self.runner.records(index, prompt, turns)
        self.generated += sum(len(r.output_ids) for _, r in turns)
        self.decode_tokens += sum(len(r.output_ids) - 1 for _, r in turns)  # the first token is the prefill's
        self.rounds += sum(len(r.rounds) for _, r in turns)
        self.decode_s += sum(r.decode_ms for _, r in turns) / 1e3
        return run_parts(rounds, rows)

    def stats(self) -> str:
        """τ and a tok/s pooling every token of the session (decode time only); the summary's is the mean of
        per-prompt rates, and is labelled so."""
        return (f"τ {tau(self.decode_tokens, self.rounds):.2f}  "
                f"{self.decode_tokens / max(self.decode_s, 1e-9):.1f} tok/s pooled")


class BatchJob(RunJob):
    """`run --batch-size B`: the selection decoded B sequences at a time by one loop (core/engine.py). A
    conversation keeps its lane for all its turns; a lane whose conversation ends takes the next prompt in the
    selection's order. A prompt's rows are written when its last turn ends (so not in selection order), and a
    killed run keeps every finished prompt. Throughput is every output token over the wall time of the
    recorded prompts' decoding, prefills of refilled slots included (run.json `throughput`)."""

    def __init__(self, runner: Runner, size: int) -> None:
        super().__init__(runner)
        model, plan = runner.model, runner.plan
        self.batch = TargetModel(model.model, model.device, plan.compile_mode, plan.buckets, plan.batch_invariant,
                                 slots=size, packed=plan.prepacked)
        self.throughput = Throughput()
        self.batch_rounds = 0

    def compile(self, longest: int) -> dict:
        """Size the shared cache (compiled or not: a batch never grows it inside a round) and compile."""
        self.batch.plan(longest)
        if self.batch.compile_mode is None:
            return {}
        for target in self.batch.slots:  # captured layers and reserved entries are part of the graph
            self.runner.method.attach(target)
        return compile_record(self.runner.plan, self.batch.kv.capacity, self.batch.warm_up(),
                              batch=len(self.batch.slots))

    def late_compiles(self) -> list:
        return self.batch.late_compiles

    def warm_up(self, prompt: Prompt) -> None:
        self._decode([(0, prompt)], lambda conv: None)

    def decode_all(self, todo: list[tuple[int, Prompt]], finished: Callable[[int, Prompt, dict], None]) -> None:
        def done(conv: Conversation) -> None:
            self.throughput.add(conv)
            finished(conv.index, conv.prompt, self.tables(conv.index, conv.prompt, conv.turns))

        self.throughput.start()
        self.batch_rounds += self._decode(todo, done).rounds

    def _decode(self, todo: list[tuple[int, Prompt]], done: Callable[[Conversation], None]):
        waiting = collections.deque(Conversation(i, p) for i, p in todo)
        lanes: dict[int, Conversation] = {}

        def feed(lane: int, result: TurnResult | None) -> Turn | None:
            conv = lanes.pop(lane, None)
            if conv is not None:
                conv.add(result, self.runner.model)
                if conv.finished:
                    done(conv)
                    conv = None
            if conv is None and not waiting:
                return None
            lanes[lane] = conv = conv or waiting.popleft()
            return self.runner.next_turn(conv)

        return decode(self.batch, self.runner.method, len(self.batch.slots), self.runner.settings, feed)

    def stats(self) -> str:
        return f"τ {tau(self.decode_tokens, self.rounds):.2f}  {self.throughput.line()}"


def execute(plan: Plan, console: Console, model: LoadedModel | None = None) -> Path:
    """Take the results folder (one writer per folder), then record the run and print its summary. `model`: an
    already loaded target of the plan's model, device and dtype."""
    for line in plan.notes:
        console.print(line, highlight=False, soft_wrap=True)
    folder = RunFolder(plan.out, RUN_TABLES)
    with folder.session(plan.config.resume, lambda line: console.print(line, highlight=False)):
        if plan.config.engine == "vllm":
            from specbench_cli.engines import vllm

            vllm.record(plan, folder, console, dict(os.environ))
        else:
            _record(plan, folder, console, model)
    print_summary(plan.out, console)
    return plan.out


def _record(plan: Plan, folder: RunFolder, console: Console, model: LoadedModel | None) -> None:
    gpu = GpuTelemetry(plan.device)
    session = new_session(plan.device, gpu.info())
    weights = drafter_weights(plan)
    resumed = folder.resumed(plan.settings(), session["environment"], weights=weights) if plan.config.resume else None
    done = folder.finished() if resumed else set()
    split = plan.config.device == "split"
    model = loaded_target(plan, model, split)
    runner = Runner(plan, model)
    longest = runner.check_lengths()  # a prompt past the model's context is refused before anything decodes
    info = resumed or RunInfo(plan.settings(), session["started"], session["environment"], more={
        "method_class": f"{plan.method_cls.__module__}.{plan.method_cls.__name__}",
        "inherent_syncs": plan.method_cls.inherent_syncs, "clock": PhaseClock(plan.device).name,
        "prompts_selected": len(plan.prompts), "weight_bytes": hardware.weight_bytes(model.model),
        "drafter_weights": weights, "dtype_choice": plan.dtype_reason,
        **({"tuned_from": plan.tuned_from} if plan.tuned_from else {}),
        **({"device_map": getattr(model.model, "hf_device_map", "auto")} if split else {})})  # acceptance studies only
    folder.start(info, session)
    if plan.config.dtype == "auto":
        console.print(f"target in {str(plan.dtype).removeprefix('torch.')} ({plan.dtype_reason}; --dtype to choose)",
                      highlight=False, soft_wrap=True)
    job = BatchJob(runner, plan.config.batch_size) if plan.config.batch_size > 1 else RunJob(runner)
    compiled = job.compile(longest)  # compile time is reported here and never enters a timed round
    if plan.compile_mode is not None:
        info.more["compile"] = compiled
        folder.write_info(info)
    warm_up(folder, job, plan, console)
    gpu.start()
    record_prompts(folder, job, plan, done, console, f"{plan.config.method} on {plan.config.dataset}")
    if job.late_compiles():
        info.more["compile"]["late"] = job.late_compiles()  # sizes past every bucket: compiled inside a round
    if isinstance(job, BatchJob):
        info.more["throughput"] = {**job.throughput.summary(), "batch_rounds": job.batch_rounds}
    folder.complete(info, prompts=len(plan.prompts) - len(done), tokens=job.generated,
                    **hardware.peak_memory(plan.device), **gpu.stop(job.generated))  # energy: this session's


def compile_record(plan: Plan, capacity: int, seconds: dict[int, float], **more) -> dict:
    """run.json's `compile`: mode, buckets, the cache capacity the graphs were built for, seconds per bucket."""
    return {"mode": plan.compile_mode, "buckets": list(plan.buckets), "capacity": capacity, **more,
            "seconds": {str(k): round(v, 2) for k, v in seconds.items()}}


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


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


def progress_bar(console: Console, remaining: bool = True) -> Progress:
    """The one rich progress bar layout (description, bar, n/total, live stats, elapsed and, unless the caller
    estimates it itself, rich's time remaining)."""
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[stats]}"), TimeElapsedColumn()]
    return Progress(*columns, *([TimeRemainingColumn()] if remaining else []), console=console)
