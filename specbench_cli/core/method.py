"""What the decode loop needs from a method.

A method is a `Proposer` (returns a DraftTree each round) or, for routed methods, a `Method` whose
`route` picks one of several proposers each round. Hyper-parameters are a dataclass `Options` on the
method class; `--opt key=value` fills it, typed by the dataclass fields (`core/options.py`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol, Union

import torch

from specbench_cli.core.errors import UsageError
from specbench_cli.core.tree import DraftTree

if TYPE_CHECKING:
    from specbench_cli.core.target import Target, VerifyExtras
    from specbench_cli.core.timing import PhaseClock
    from specbench_cli.core.turn import DecodeSettings, TurnResult


class LoadedModel(Protocol):
    """What a method may read about the loaded target (the commands' loader fills it; core never loads)."""

    spec: object  # the model as the commands registered it: .name, .drafters (drafter name -> checkpoint)
    model: torch.nn.Module
    tokenizer: object
    stop_ids: frozenset[int]
    device: torch.device
    dtype: torch.dtype
    cache_dir: Path  # where a method may cache what it builds once per checkpoint (a clustered head's clusters)


@dataclass
class DecodeState:
    """What a proposer may read in a round. `tokens` is prompt + output so far; its last one is the root."""

    tokens: list[int]
    prompt_len: int
    target: Target
    temperature: float
    generator: torch.Generator | None
    clock: PhaseClock | None = None
    # What the caller knows of the prompt (the runner gives dataset, category, subtask and prompt id); the loop
    # never reads it. A method that behaves per prompt kind reads it here (a router calibrated per category).
    context: Mapping[str, str] = field(default_factory=dict)
    # Target logits [V] at the newest committed position (the distribution the bonus token came from);
    # routers read it. Set after prefill and after every round, on the device, never synced by the loop.
    next_logits: torch.Tensor | None = None
    # The host copy of the method's `read_ahead` value at the newest committed position, where the loop read it
    # with the prefill's token or a greedy round's acceptance; None otherwise (a sampled round).
    ahead: torch.Tensor | None = None
    # Each proposer's own state for this sequence and turn (`Proposer.lane`): kept here, so that a proposer serves
    # any number of sequences without owning any of them.
    lanes: dict[Proposer, object] = field(default_factory=dict)

    def timed(self, part: str):
        """Time a part of the draft phase (e.g. "draft_head") when the loop is timing rounds."""
        return self.clock.phase(part) if self.clock is not None else nullcontext()


class Proposer:
    """A draft source for any number of sequences at once.

    A proposer holds what every sequence shares (weights, cross-request caches) and keeps what it needs per
    sequence in that sequence's `DecodeState`: `lane(state)`, an instance of its `Lane` dataclass made afresh each
    turn — the shape of vLLM's v1 proposers, whose runner owns per-request state. Drafting is batch-only:
    `propose(states)` drafts for every sequence given (a turn alone is a list of one); a drafter whose drafting
    is per sequence on the host says how in `propose_one`. Model-free proposers only read `state.tokens`."""

    name: ClassVar[str] = "?"

    @dataclass
    class Lane:
        """What the proposer keeps per sequence and turn (a subclass extends it)."""

    def lane(self, state: DecodeState) -> Lane:
        """This proposer's state for the sequence `state` (made on first use in a turn)."""
        lane = state.lanes.get(self)
        if lane is None:
            lane = state.lanes[self] = self.Lane()
        return lane

    def serve(self, lanes: int) -> None:
        """The loop is about to decode up to `lanes` sequences at once with this proposer."""

    def attach(self, target: Target) -> None:
        """Called before each prefill: model-based proposers ask the target for the features they read."""

    def start(self, state: DecodeState) -> None:
        """A new turn begins (its prompt is `state.tokens`, whose last token is the prefill's token)."""

    def catch_up(self, states: list[DecodeState]) -> None:
        """Absorb tokens accepted while this proposer was idle, for each sequence of `states` (routed methods'
        lazy catch-up); a network drafter does them in one forward."""

    # A proposer that runs target forwards of its own before drafting sets this; the loop then calls
    # `extra_forward` each round and times it as its own phase (a draft model's non-deferred ablation).
    extra_forwards: ClassVar[bool] = False

    def extra_forward(self, state: DecodeState) -> None:
        """Target forwards this proposer needs outside verify, before it drafts."""

    def propose(self, states: list[DecodeState]) -> list[DraftTree]:
        """A draft for each sequence of `states`. A drafter that runs a network drafts them all in one forward
        per step (a loop of B forwards would make batch throughput meaningless); host-side drafting is per
        sequence (`propose_one`)."""
        return [self.propose_one(s) for s in states]

    def propose_one(self, state: DecodeState) -> DraftTree:
        raise NotImplementedError

    def verify_extras(self, state: DecodeState, tree: DraftTree) -> VerifyExtras | None:
        """What to add to the target's verify of `tree` (side rows, an already cached root); None: nothing."""
        return None

    def observe(self, state: DecodeState, new_tokens: list[int]) -> None:
        """Tokens committed this round (accepted drafts + bonus, cut at a stop)."""

    def finish(self, state: DecodeState) -> None:
        """The turn ended; `state.tokens[state.prompt_len:]` is its output."""

    def absorb(self, output_ids: list[int]) -> None:
        """Take in the output of a turn decoded earlier (resume and warm-up replay cross-prompt state)."""

    def draft_info(self, state: DecodeState) -> dict | None:
        """What trace replay records about the sequence's last draft besides its accepted length (None: nothing)."""
        return None

    def compile(self, mode: str, longest: int, lanes: int) -> dict[str, float]:
        """`--compile`: build this proposer's compiled draft steps for sequences of up to `longest` positions, up
        to `lanes` at a time, before anything is timed; seconds per graph (`core.compiling.StepGraphs`). A
        proposer without a network has nothing to compile."""
        return {}

    def late_compiles(self) -> list[str]:
        """Graphs of this proposer compiled inside a timed round (a shape `compile` did not foresee)."""
        return []


def proposers(proposer: Proposer) -> list[Proposer]:
    """A proposer and every proposer it holds (a router's), each once."""
    found: dict[int, Proposer] = {}

    def walk(p: Proposer) -> None:
        found[id(p)] = p
        for v in _held(p):
            if isinstance(v, Proposer) and id(v) not in found:
                walk(v)

    walk(proposer)
    return list(found.values())


def networks(proposer: Proposer) -> list[torch.nn.Module]:
    """The networks a proposer holds, its own proposers' included. What a run that keeps one copy of each weight
    packs and frees (`kernels.keep_one_copy_of`)."""
    found: dict[int, torch.nn.Module] = {}
    for p in proposers(proposer):
        for v in _held(p):
            if isinstance(v, torch.nn.Module):
                found.setdefault(id(v), v)
    return list(found.values())


def _held(p: Proposer) -> Iterator:
    """A proposer's attributes, and the values of those that are dicts (a router's `proposers`)."""
    for value in vars(p).values():
        yield from value.values() if isinstance(value, dict) else (value,)


class Method(Proposer):
    """A registered method. Single-proposer methods are their own proposer; a `Router` picks one of several per
    round, and an `OwnLoop` runs a loop of its own."""

    @dataclass
    class Options:
        pass

    drafter_names: ClassVar[tuple[str, ...]] = ()  # checkpoints it loads; `--drafter NAME=PATH` overrides
    optional_drafters: ClassVar[tuple[str, ...]] = ()  # further `--drafter` names it accepts but can do without
    how_to_make: ClassVar[dict[str, str]] = {}  # drafter name -> how a user makes a missing one ({model})
    # The drafter name of the artifact `specbench calibrate` makes for this method, whose config.json holds
    # the calibrated decision values (thresholds); "" for methods with no calibration.
    calibration: ClassVar[str] = ""
    # Host syncs the algorithm needs in a round beyond reading the accepted length (recorded in run.json).
    inherent_syncs: ClassVar[str] = "one per round: accepted length to host"
    drafts: ClassVar[bool] = True  # whether it ever proposes a draft token (`--acceptance` needs one to decide on)
    # Whether it reads the target's weights outside our target's packed forward (a model's own `generate()`, a
    # draft model that copies the target's head): a run of it keeps the plain weights (`planning.one_weight_copy`).
    reads_target_weights: ClassVar[bool] = False

    # Whether the method reads a device value at each round's start (a router's score): it computes it in
    # `read_ahead`, and the loop brings it to the host in the read that brings the tokens (`DecodeState.ahead`).
    reads_ahead: ClassVar[bool] = False

    def read_ahead(self, target: Target, logits: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        """The device value the next round starts from, at the row that becomes the newest committed one:
        `logits`, the target's next-token logits there [V]; `row`, its index in `target.captured`'s rows (a
        one-element long tensor on the device, not read: at a round's end, the accepted node)."""
        raise NotImplementedError

    @classmethod
    def reads_calibration(cls, options: Options) -> bool:
        """Whether a run with these options reads the `calibration` artifact (an option may stand in for it)."""
        return bool(cls.calibration)

    def __init__(self, options: Options, model: LoadedModel, drafters: dict[str, str] | None = None) -> None:
        self.options = options
        self.model = model
        self.drafters = drafters or {}

    def given_drafter(self, name: str) -> str | None:
        """The checkpoint of drafter `name` if the run or the loaded model names one, else None (an optional one)."""
        return self.drafters.get(name) or getattr(self.model.spec, "drafters", {}).get(name)

    def drafter_ref(self, name: str) -> str:
        """The checkpoint of drafter `name`: the run's `--drafter` first, then the one the loaded model names
        (`LoadedModel.spec.drafters`). Which is used, and why a missing one is missing, the commands work out and
        report before anything loads (`planning.drafter_ref`); this only reads what they handed over."""
        ref = self.given_drafter(name)
        if ref is None:
            model = getattr(self.model.spec, "name", "this model")
            how = self.how_to_make.get(name, "").format(model=model)
            raise UsageError(f"no {name} drafter for {model}{f' ({how})' if how else ''}; pass --drafter "
                             f"{name}=PATH_OR_HUB_ID")
        return ref



class Router(Method):
    """A method that picks, per sequence and round, which of its proposers drafts (`route`); the loop then asks
    each proposer to catch up and draft for the sequences sent to it."""

    def route(self, state: DecodeState) -> Route:
        raise NotImplementedError


class OwnLoop(Method):
    """An outside reference that runs its own decoding loop, one turn per call (`generate`): it neither drafts
    nor batches, and its rounds are what it reports."""

    drafts = False
    reads_target_weights = True  # `generate()` runs the model's own forward

    def generate(self, prompt_ids: list[int], settings: DecodeSettings, generator: torch.Generator | None) -> TurnResult:
        raise NotImplementedError


# A per-round signal a method records: a number, a text, or a vector of numbers (written comma-separated).
Signal = Union[int, float, str, tuple[float, ...]]


@dataclass
class Route:
    """A routed method's choice for one round, and what it decided from.

    `extras` is the method's own: each key becomes a column of the rounds table (its inputs, its score, the
    catch-up backlog), read back by name by analysis and calibration. The loop never looks inside."""

    proposer: Proposer
    also: tuple[Proposer, ...] = ()  # idle proposers to bring up to date too (the always-in-sync ablation)
    extras: dict[str, Signal] = field(default_factory=dict)
