"""`specbench run` on our engine: load the target and method, decode the selected prompts `--batch-size` at a
time (a batch of one is one lane of the same loop), write records as each prompt finishes.

Everything that can be checked without loading a model is checked first (`inputs.check_run`, then
`planning.plan`), so bad input costs nothing. The folder's life (claim, resume, parts, interruption) is
`run_folder.record`'s; this module is the job it runs for our engine (`RunJob`) and the `Runner` that `oracle`
and `profile` decode one sequence with. The results directory is never overwritten: an existing one needs
`--resume`, which continues it with the same settings and gives the same records an uninterrupted run would have.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import pyarrow as pa
import torch
from rich.console import Console

from specbench_cli import hardware
from specbench_cli.analysis.metrics import tau
from specbench_cli.conversations import Conversation, Throughput, turn_records, turn_seed
from specbench_cli.core.acceptance import SyntheticAcceptance
from specbench_cli.core.dtypes import dtype_name
from specbench_cli.core.engine import Turn, decode, decode_turn
from specbench_cli.core.kernels import keep_one_copy, keep_one_copy_of
from specbench_cli.core.method import Method, OwnLoop, networks, proposers
from specbench_cli.core.target import TargetModel
from specbench_cli.core.timing import PhaseClock
from specbench_cli.core.turn import DecodeSettings, TurnResult
from specbench_cli.datasets import Prompt
from specbench_cli.greedy_replay import Replayed, Replayer, replay_off, replays
from specbench_cli.inputs import Plan
from specbench_cli.loading import LoadedModel, target_weights
from specbench_cli.models import cache_root, family, random_weights_record
from specbench_cli.random_weights import drafter_seed, is_random_drafter, random_drafter
from specbench_cli.planning import check_lengths, drafter_weights, loaded_target, one_weight_copy
from specbench_cli.records import run_parts
from specbench_cli.run_folder import OneAtATime, RunInfo, Start, new_session
from specbench_cli.telemetry import GpuTelemetry


# ---------------------------------------------------------------------------------------------- running
def context(prompt: Prompt) -> dict[str, str]:
    """What a method may know of the prompt it decodes (`DecodeState.context`)."""
    return {"dataset": prompt.dataset, "category": prompt.category, "subtask": prompt.subtask, "prompt_id": prompt.id}


class Runner:
    """A loaded target of `--batch-size` slots (`batch`) and the method that drafts on it; `target` is its first
    slot, where `decode_prompt` decodes one sequence alone (`oracle`, `profile`)."""

    def __init__(self, plan: Plan, model: LoadedModel) -> None:
        self.plan = plan
        self.model = model
        self.batch = TargetModel(model.model, model.device, plan.compile_mode, plan.buckets, plan.batch_invariant,
                                 slots=plan.config.batch_size, packed=plan.prepacked)
        self.target = self.batch.slots[0]
        self.drafters = drafter_folders(plan, model)
        self.method: Method = plan.method_cls(plan.options, model, self.drafters)
        self.retired_late: list[str] = []  # late compiles of methods a --repeat pass replaced
        acceptance = plan.acceptance and SyntheticAcceptance(plan.acceptance.rates, plan.config.seed)
        self.settings = DecodeSettings(plan.config.max_new_tokens, plan.config.temperature, model.stop_ids, acceptance)
        self.run_name = plan.out.name

    def compile(self, longest: int, also: tuple[Method, ...] = ()) -> dict:
        """Size the cache for `longest` positions (`check_lengths`' answer) so that no timed round grows it, and,
        compiled, build every bucket's graph before anything is timed (`also`: further methods whose captured
        layers the graphs must return, e.g. the oracle's replayers); run.json's `compile`."""
        self.batch.plan(longest)
        if self.plan.compile_mode is None:
            return {}
        for method in (self.method, *also):  # captured layers and reserved entries are part of the graph
            for target in self.batch.slots:
                method.attach(target)
        slots = len(self.batch.slots)
        seconds = self.batch.warm_up()
        drafters = self.compile_drafters(longest)
        return compile_record(self.plan, self.batch.kv.capacity, seconds, **({"batch": slots} if slots > 1 else {}),
                              **({"drafters": drafters} if drafters else {}))

    def compile_drafters(self, longest: int) -> dict[str, float]:
        """Compile the method's draft steps (each proposer's, a router's included) for sequences of up to `longest`
        positions; seconds per graph."""
        seconds: dict[str, float] = {}
        for p in proposers(self.method):
            seconds.update(p.compile(self.plan.compile_mode, longest, len(self.batch.slots)))
        return {name: round(s, 2) for name, s in seconds.items()}

    @property
    def late_compiles(self) -> list:
        """What compiled inside a timed round: the target's forwards past every bucket, drafters' unforeseen shapes
        (earlier passes' methods' included)."""
        return [*self.batch.late_compiles, *self.retired_late, *self._drafters_late()]

    def _drafters_late(self) -> list[str]:
        return [name for p in proposers(self.method) for name in p.late_compiles()]

    def replace_method(self, method: Method, longest: int) -> None:
        """Decode with a new instance of the method from now on (a `--repeat` pass), its drafters compiled before
        it decodes; the late compiles of the one it replaces are kept."""
        self.retired_late += self._drafters_late()
        self.method = method
        if self.plan.compile_mode is not None:
            self.compile_drafters(longest)

    def check_lengths(self) -> int:
        return check_lengths(self.plan, self.model, getattr(self.model.model.config, "max_position_embeddings", None))

    def decode_prompt(self, prompt: Prompt) -> list[tuple[list[int], TurnResult]]:
        """All turns of a prompt alone, each turn seeing the model's own earlier answers."""
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


def drafter_folders(plan: Plan, model: LoadedModel) -> dict[str, str]:
    """The run's drafters, each random one (`--drafter NAME=random`, or a random target's) written to the cache
    at its method's released shapes for this target and named by its folder."""
    cls, folders = plan.method_cls, dict(plan.drafters)
    for name in (*cls.drafter_names, *cls.optional_drafters):
        ref = plan.drafters.get(name) or plan.spec.drafters.get(name)
        if ref is not None and is_random_drafter(ref):
            seed = drafter_seed(ref, plan.spec.target)
            folders[name] = str(random_drafter(name, model.model, cache_root() / "random-drafters", seed,
                                               family(plan.spec)))
    return folders


def compile_record(plan: Plan, capacity: int, seconds: dict[int, float], **more) -> dict:
    """run.json's `compile`: mode, buckets, the cache capacity the graphs were built for, seconds per bucket."""
    return {"mode": plan.compile_mode, "buckets": list(plan.buckets), "capacity": capacity, **more,
            "seconds": {str(k): round(v, 2) for k, v in seconds.items()}}


# ---------------------------------------------------------------------------------------------- the job
class RunJob(OneAtATime):
    """`run`'s rows on our engine: the selection decoded `--batch-size` B sequences at a time by one loop
    (core/engine.py), a batch of one being one lane. A conversation keeps its lane for all its turns; a lane whose
    conversation ends takes the next prompt in the selection's order. A prompt's rows are written when its last
    turn ends (at B > 1 not in selection order), and a killed run keeps every finished prompt. Its turns are
    replayed (greedy_replay.py) when no other sequence is in flight: at once in a batch of one, after the batch
    otherwise (a turn's time is wall time, which a replay between rounds would add to every other lane's). A batch
    records its throughput: every output token over the wall time of the recorded prompts' decoding, prefills of
    refilled slots included (run.json `throughput`)."""

    def __init__(self, plan: Plan, console: Console, model: LoadedModel | None = None) -> None:
        self.plan, self.console, self.given = plan, console, model
        self.label = f"{plan.config.method} on {plan.config.dataset}"
        self.lanes = plan.config.batch_size
        self.gpu = GpuTelemetry(plan.device)
        self.generated = self.decode_tokens = self.rounds = 0
        self.decode_s = 0.0
        self.throughput = Throughput()
        self.batch_rounds = 0
        self.unreplayed: list[Conversation] = []  # finished in a batch, to replay once no sequence is in flight
        self.announce_dtype = True  # the "target in bfloat16 (auto: ...)" line; once for a list of methods

    def begin(self) -> Start:
        self.weights = drafter_weights(self.plan)
        self.target_weights = target_weights(self.plan.spec)
        return Start(self.plan.settings(), new_session(self.plan.device, self.gpu.info()), weights=self.weights,
                     target=self.target_weights)

    def prepare(self) -> dict:
        plan = self.plan
        split = plan.config.device == "split"
        model = loaded_target(plan, self.given, split)
        if self.given is None:  # loaded for this run alone
            model.one_copy = one_weight_copy([plan])
        self.runner = Runner(plan, model)
        self.longest = self.runner.check_lengths()
        self.replayer = Replayer(model.model, model.device) if replays(plan.config) else None
        # After every target over the model was built: their start-up probes (core/target/probes.py) read the plain
        # weights of the first layer and the head. A later run's targets over the freed model find those probes'
        # results cached (the same dtype, packing, stacking and device: `_same_target`) or, for a probe not yet run,
        # the first layer's linears packed one by one by the stacking probe.
        if model.one_copy:
            keep_one_copy(model.model, self.runner.batch.kernels)
            keep_one_copy_of(networks(self.runner.method))
        return {"method_class": f"{plan.method_cls.__module__}.{plan.method_cls.__name__}",
                "inherent_syncs": plan.method_cls.inherent_syncs, "clock": PhaseClock(plan.device).name,
                "prompts_selected": len(plan.prompts), "weight_bytes": hardware.weight_bytes(model.model),
                "drafter_weights": self.weights, "target_weights": self.target_weights, "dtype_choice": plan.dtype_reason,
                "replay": self.replayer.reference if self.replayer else replay_off(plan.config),
                "attention": self.runner.batch.attention, "layers": self.runner.batch.layers,
                "rows": self.runner.batch.rows, "stacked": self.runner.batch.kernels.stack,
                "weight_copies": 1 if model.one_copy else 2 if plan.prepacked else 1,
                **({"tuned_from": plan.tuned_from} if plan.tuned_from else {}),
                **({"cpu_budget_from": plan.cpu_budget_from} if plan.cpu_budget_from else {}),
                **random_weights_record(plan.spec.target),
                **({"device_map": getattr(model.model, "hf_device_map", "auto")} if split else {})}  # acceptance studies only

    @contextmanager
    def running(self, info: RunInfo, save: Callable[[], None]) -> Iterator[None]:
        """Size the cache and compile before anything is timed (compile time is reported in run.json, never
        inside a round)."""
        if self.plan.config.dtype == "auto" and self.announce_dtype:
            self.console.print(f"target in {dtype_name(self.plan.dtype)} ({self.plan.dtype_reason}; "
                               "--dtype to choose)", highlight=False, soft_wrap=True)
        if self.plan.compile_mode is not None:
            self.console.print(f"compiling ({self.plan.compile_mode}) the target's {len(self.plan.buckets)} verify sizes "
                               "and the drafters' steps before anything is timed (minutes on a CPU)", highlight=False)
        compiled = self.runner.compile(self.longest)
        if self.plan.compile_mode is not None:
            info.more["compile"] = compiled
            save()
        yield
        if self.runner.late_compiles:  # sizes past every bucket, drafters' unforeseen shapes: compiled in a round
            info.more["compile"]["late"] = self.runner.late_compiles

    def warm_up(self, prompt: Prompt) -> None:
        self._decode([(0, prompt)], lambda conv: None)

    def absorb(self, output_ids: list[int]) -> None:
        self.runner.method.absorb(output_ids)

    def new_pass(self) -> None:
        """A new pass over the selection (`run --repeat`) starts from a new method, so no cross-prompt state (a
        suffix cache) carries the previous pass's answers to the same prompts."""
        plan = self.plan
        self.runner.replace_method(plan.method_cls(plan.options, self.runner.model, self.runner.drafters), self.longest)
        if self.runner.model.one_copy:
            keep_one_copy_of(networks(self.runner.method))

    def starting(self) -> AbstractContextManager:
        return nullcontext()  # nothing boots in the background: the target is loaded in `prepare`

    def decode(self, index: int, prompt: Prompt) -> dict[str, pa.Table]:
        """One prompt alone (a member of an interleaved list)."""
        tables: dict[str, pa.Table] = {}
        self._decode([(index, prompt)], lambda conv: tables.update(self._finished(conv)))
        return tables

    def decode_all(self, todo: list[tuple[int, Prompt]], finished: Callable[..., None]) -> None:
        """Every prompt of `todo`, each one's rows handed to `finished` as its last turn ends."""
        self.gpu.start()  # energy counts the recorded prompts only
        self.throughput.start()
        self.batch_rounds += self._decode(todo, lambda conv: finished(conv.index, conv.prompt,
                                                                      self._finished(conv))).rounds
        self.throughput.stop()

    def _finished(self, conv: Conversation) -> dict[str, pa.Table]:
        """A finished conversation's rows: replayed first in a batch of one (nothing else is in flight), else
        without its replay, which waits for `replayed`."""
        self.throughput.add(conv)
        self.count(conv.turns)
        if self.lanes == 1:
            return self.parts(conv.index, conv.prompt, conv.turns, self.replay(conv.turns))
        if self.replayer is not None:
            self.unreplayed.append(conv)
        return self.parts(conv.index, conv.prompt, conv.turns)

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

        return decode(self.runner.batch, self.runner.method, self.lanes, self.runner.settings, feed)

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
        """τ, and a tok/s: alone, pooling every token of the session (decode time only; the summary's is the mean
        of per-prompt rates, and is labelled so); in a batch, the throughput."""
        rate = (f"{self.decode_tokens / max(self.decode_s, 1e-9):.1f} tok/s pooled" if self.lanes == 1
                else self.throughput.line())
        return f"τ {tau(self.decode_tokens, self.rounds):.2f}  {rate}"

    def replayed(self) -> list[tuple[int, dict]]:
        """A batch's finished prompts, replayed now that no sequence is in flight."""
        convs, self.unreplayed = self.unreplayed, []
        return [(c.index, self.parts(c.index, c.prompt, c.turns, self.replay(c.turns))) for c in convs]

    def facts(self, info: RunInfo) -> dict:
        if self.lanes > 1:
            info.more["throughput"] = {**self.throughput.summary(), "batch_rounds": self.batch_rounds}
        return {"tokens": self.generated, **hardware.peak_memory(self.plan.device),
                **self.gpu.stop(self.generated)}  # energy: this session's
