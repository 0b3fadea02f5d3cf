"""`specbench run` on our engine: load the target and method, decode the selected prompts turn by turn (or
B at a time), write records as each prompt finishes, and print the summary table.

Everything that can be checked without loading a model is checked first (`inputs.check_run`, then
`planning.plan`), so bad input costs nothing. The folder's life (claim, resume, parts, interruption) is
`run_folder.record`'s; this module is the job it runs for our engine (`RunJob`, `BatchJob`), and `execute`
picks the job of the run's engine from `engines.ENGINES`. The results directory is never overwritten: an
existing one needs `--resume`, which continues it with the same settings and gives the same records an
uninterrupted run would have.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import pyarrow as pa
import torch
from rich.console import Console

from specbench_cli import hardware
from specbench_cli.analysis.metrics import tau
from specbench_cli.analysis.summary import print_summary
from specbench_cli.conversations import Conversation, Throughput, turn_records, turn_seed
from specbench_cli.core.engine import Turn, decode, decode_turn
from specbench_cli.core.method import Method, OwnLoop
from specbench_cli.core.target import Target, TargetModel
from specbench_cli.core.timing import PhaseClock
from specbench_cli.core.turn import DecodeSettings, TurnResult
from specbench_cli.datasets import Prompt
from specbench_cli.engines import engine_entry
from specbench_cli.inputs import Plan
from specbench_cli.loading import LoadedModel
from specbench_cli.planning import check_lengths, drafter_weights, loaded_target
from specbench_cli.records import RUN_TABLES, run_parts
from specbench_cli.greedy_replay import Replayed, Replayer, replays
from specbench_cli.run_folder import OneAtATime, RunFolder, RunInfo, Start, new_session, record
from specbench_cli.telemetry import GpuTelemetry
from specbench_cli.core.dtypes import dtype_name


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

    def records(self, index: int, prompt: Prompt, turns: list[tuple[list[int], TurnResult]],
                replays: list[Replayed] | None = None):
        clock = PhaseClock(self.model.device).name if not isinstance(self.method, OwnLoop) else "perf_counter_ns (streamer)"
        return turn_records(self.plan, self.run_name, clock, self.model.decode, index, prompt, turns, replays=replays)


def compile_record(plan: Plan, capacity: int, seconds: dict[int, float], **more) -> dict:
    """run.json's `compile`: mode, buckets, the cache capacity the graphs were built for, seconds per bucket."""
    return {"mode": plan.compile_mode, "buckets": list(plan.buckets), "capacity": capacity, **more,
            "seconds": {str(k): round(v, 2) for k, v in seconds.items()}}


# ---------------------------------------------------------------------------------------------- `run`
def execute(plan: Plan, console: Console, model: LoadedModel | None = None) -> Path:
    """Take the results folder (one writer per folder), record the run with its engine's job, and print its
    summary. `model`: an already loaded target of the plan's model, device and dtype (our engine)."""
    for line in plan.notes:
        console.print(line, highlight=False, soft_wrap=True)
    folder = RunFolder(plan.out, RUN_TABLES)
    job = engine_entry(plan.config.engine).make_job(plan, console, model)
    with folder.session(plan.config.resume, lambda line: console.print(line, highlight=False)):
        record(folder, job, plan.prompts, plan.warmup, plan.config.resume, console, job.label)
    print_summary(plan.out, console)
    return plan.out


def run_job(plan: Plan, console: Console, model: LoadedModel | None = None) -> RunJob:
    """Our engine's job for a run: one sequence at a time, or `--batch-size` together."""
    return BatchJob(plan, console, model) if plan.config.batch_size > 1 else RunJob(plan, console, model)


class RunJob(OneAtATime):
    """`run`'s rows: a prompt decoded by the method -> its rounds and prompts records."""

    def __init__(self, plan: Plan, console: Console, model: LoadedModel | None = None) -> None:
        self.plan, self.console, self.given = plan, console, model
        self.label = f"{plan.config.method} on {plan.config.dataset}"
        self.gpu = GpuTelemetry(plan.device)
        self.generated = self.decode_tokens = self.rounds = 0
        self.decode_s = 0.0
        self.announce_dtype = True  # the "target in bfloat16 (auto: ...)" line; once for a list of methods

    def begin(self) -> Start:
        self.weights = drafter_weights(self.plan)
        return Start(self.plan.settings(), new_session(self.plan.device, self.gpu.info()), weights=self.weights)

    def prepare(self) -> dict:
        plan = self.plan
        split = plan.config.device == "split"
        model = loaded_target(plan, self.given, split)
        self.runner = Runner(plan, model)
        self.longest = self.runner.check_lengths()
        self.replayer = Replayer(model.model, model.device) if replays(plan.config) else None
        return {"method_class": f"{plan.method_cls.__module__}.{plan.method_cls.__name__}",
                "inherent_syncs": plan.method_cls.inherent_syncs, "clock": PhaseClock(plan.device).name,
                "prompts_selected": len(plan.prompts), "weight_bytes": hardware.weight_bytes(model.model),
                "drafter_weights": self.weights, "dtype_choice": plan.dtype_reason,
                "replay": self.replayer.reference if self.replayer else "off",
                "attention": self.runner.target.shared.attention, "layers": self.runner.target.shared.layers,
                **({"tuned_from": plan.tuned_from} if plan.tuned_from else {}),
                **({"device_map": getattr(model.model, "hf_device_map", "auto")} if split else {})}  # acceptance studies only

    @contextmanager
    def running(self, info: RunInfo, save: Callable[[], None]) -> Iterator[None]:
        """Compile before anything is timed (compile time is reported in run.json, never inside a round)."""
        if self.plan.config.dtype == "auto" and self.announce_dtype:
            self.console.print(f"target in {dtype_name(self.plan.dtype)} ({self.plan.dtype_reason}; "
                               "--dtype to choose)", highlight=False, soft_wrap=True)
        compiled = self.compile(self.longest)
        if self.plan.compile_mode is not None:
            info.more["compile"] = compiled
            save()
        yield
        if self.late_compiles():
            info.more["compile"]["late"] = self.late_compiles()  # sizes past every bucket: compiled inside a round

    def compile(self, longest: int) -> dict:
        """Size the cache and compile every bucket before anything is timed (run.json's `compile`)."""
        return self.runner.compile(longest)

    def late_compiles(self) -> list:
        return self.runner.target.late_compiles

    def warm_up(self, prompt: Prompt) -> None:
        self.runner.decode_prompt(prompt)

    def absorb(self, output_ids: list[int]) -> None:
        self.runner.method.absorb(output_ids)

    def new_pass(self) -> None:
        """A new pass over the selection (`run --repeat`) starts from a new method, so no cross-prompt state (a
        suffix cache) carries the previous pass's answers to the same prompts."""
        plan = self.plan
        self.runner.method = plan.method_cls(plan.options, self.runner.model, plan.drafters)

    def starting(self) -> AbstractContextManager:
        return nullcontext()  # nothing boots in the background: the target is loaded in `prepare`

    def decode_all(self, todo: list[tuple[int, Prompt]], finished: Callable[[int, Prompt, dict], None]) -> None:
        self.gpu.start()  # energy counts the recorded prompts only
        super().decode_all(todo, finished)

    def decode(self, index: int, prompt: Prompt) -> dict[str, pa.Table]:
        return self.tables(index, prompt, self.runner.decode_prompt(prompt))

    def tables(self, index: int, prompt: Prompt, turns: list[tuple[list[int], TurnResult]]) -> dict[str, pa.Table]:
        """A decoded prompt's parts, its turns replayed first (between prompts: inside no prompt's timing)."""
        self.count(turns)
        return self.parts(index, prompt, turns, self.replay(turns))

    def replay(self, turns: list[tuple[list[int], TurnResult]]) -> list[Replayed] | None:
        return self.replayer.turns(turns) if self.replayer else None

    def parts(self, index: int, prompt: Prompt, turns: list[tuple[list[int], TurnResult]],
              replays: list[Replayed] | None = None) -> dict[str, pa.Table]:
        return run_parts(*self.runner.records(index, prompt, turns, replays))

    def count(self, turns: list[tuple[list[int], TurnResult]]) -> None:
        """The progress bar's running totals (`stats`)."""
        self.generated += sum(len(r.output_ids) for _, r in turns)
        self.decode_tokens += sum(len(r.output_ids) - 1 for _, r in turns)  # the first token is the prefill's
        self.rounds += sum(len(r.rounds) for _, r in turns)
        self.decode_s += sum(r.decode_ms for _, r in turns) / 1e3

    def stats(self) -> str:
        """τ and a tok/s pooling every token of the session (decode time only); the summary's is the mean of
        per-prompt rates, and is labelled so."""
        return (f"τ {tau(self.decode_tokens, self.rounds):.2f}  "
                f"{self.decode_tokens / max(self.decode_s, 1e-9):.1f} tok/s pooled")

    def replayed(self) -> list[tuple[int, dict]]:
        return []  # each prompt was replayed as it finished (`tables`)

    def facts(self, info: RunInfo) -> dict:
        return {"tokens": self.generated, **hardware.peak_memory(self.plan.device),
                **self.gpu.stop(self.generated)}  # energy: this session's


class BatchJob(RunJob):
    """`run --batch-size B`: the selection decoded B sequences at a time by one loop (core/engine.py). A
    conversation keeps its lane for all its turns; a lane whose conversation ends takes the next prompt in the
    selection's order. A prompt's rows are written when its last turn ends (so not in selection order), and a
    killed run keeps every finished prompt. Throughput is every output token over the wall time of the
    recorded prompts' decoding, prefills of refilled slots included (run.json `throughput`)."""

    def __init__(self, plan: Plan, console: Console, model: LoadedModel | None = None) -> None:
        super().__init__(plan, console, model)
        self.throughput = Throughput()
        self.batch_rounds = 0
        self.unreplayed: list[Conversation] = []  # finished this session, to replay once no sequence is in flight

    def prepare(self) -> dict:
        more = super().prepare()
        model, plan = self.runner.model, self.plan
        self.batch = TargetModel(model.model, model.device, plan.compile_mode, plan.buckets, plan.batch_invariant,
                                 slots=plan.config.batch_size, packed=plan.prepacked)
        return more

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

    def decode_all(self, todo: list[tuple[int, Prompt]], finished: Callable[..., None]) -> None:
        """A finished conversation's rows are written at once; its replay waits until no sequence is in flight
        (a turn's time is wall time, which a replay between rounds would add to every other lane's): `replayed`."""

        def done(conv: Conversation) -> None:
            self.throughput.add(conv)
            self.count(conv.turns)
            finished(conv.index, conv.prompt, self.parts(conv.index, conv.prompt, conv.turns))
            if self.replayer is not None:
                self.unreplayed.append(conv)

        self.gpu.start()
        self.throughput.start()
        self.batch_rounds += self._decode(todo, done).rounds
        self.throughput.stop()

    def replayed(self) -> list[tuple[int, dict]]:
        convs, self.unreplayed = self.unreplayed, []
        return [(c.index, self.parts(c.index, c.prompt, c.turns, self.replay(c.turns))) for c in convs]

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

    def facts(self, info: RunInfo) -> dict:
        info.more["throughput"] = {**self.throughput.summary(), "batch_rounds": self.batch_rounds}
        return super().facts(info)
