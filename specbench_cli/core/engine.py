"""The one decode loop every method runs in: lanes of sequences over one target model, a single sequence being one
lane (`decode_turn`).

    each free slot takes a turn (its conversation's next turn, else the next conversation) and prefills it alone
    while a slot is busy: route -> catch-up -> [extra target forward] -> draft -> one verify forward over every
                          sequence's tree -> accept -> [batch-invariant greedy trees: the accepted paths verified
                          again as chains] -> commit (each sequence its own path) -> finished turns leave, slots refill

Each round emits, per sequence, the accepted draft tokens plus one bonus token, cut at the first stop token and at
the max-new-tokens budget (never overshooting; tokens past a stop are neither emitted nor counted).

Each sequence has its own `Target`, a slot of the target model's one static cache, and its own state in every
proposer (`Proposer.lane`); one method drafts for all of them, each sequence as it would alone, so every sequence's
output is its batch-1 output: a greedy sequence's tokens are the target's argmax whatever its neighbours draft. The trees of one round differ in size (a
60-node tree, a chain, an empty draft): they share one forward (`TargetModel.run`) whose row-wise parts run on the
nodes alone, packed, and whose attention pads each tree to the largest, padding rows seeing only themselves and
landing past the sequence's committed length, where nothing reads them.

Busy sequences always fill slots 0..n-1 (when a slot empties for good, the sequence in the last busy slot moves
into it), so each forward spans exactly the sequences still decoding; the last rounds of a run, when no turn
is left to start, run with fewer sequences, and say so (`RoundInfo.batch`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

import torch

from specbench_cli.core.acceptance import Acceptance, ReadAhead, accept, accept_greedy_all, pick, pick_on_device
from specbench_cli.core.host_copy import to_device, to_host
from specbench_cli.core.method import DecodeState, Method, OwnLoop, Proposer, Route, Router
from specbench_cli.core.target import Target, TargetModel
from specbench_cli.core.timing import PhaseClock, sync
from specbench_cli.core.tree import DraftTree
from specbench_cli.core.turn import DecodeSettings, RoundInfo, TurnResult, cut


@dataclass
class Turn:
    """One turn to decode: its prompt ids, its own generator (so a sequence samples what it samples alone) and
    what the method may know of the prompt (`DecodeState.context`)."""

    prompt_ids: list[int]
    generator: torch.Generator | None = None
    context: Mapping[str, str] = field(default_factory=dict)


# feed(lane, finished): the caller's scheduler. Called with None when lane `lane` (a sequence stream, which keeps
# its number while its slot changes) first asks for work, then with each turn it finishes; returns the lane's next
# turn (a conversation's next turn stays on its lane) or None when there is nothing left for it.
Feed = Callable[[int, "TurnResult | None"], "Turn | None"]


@dataclass
class BatchStats:
    """What the lanes decoded: rounds, tokens emitted (first tokens included) and the wall time of it all
    (prefills of refilled slots included: they stall every other sequence)."""

    rounds: int = 0
    tokens: int = 0
    wall_ms: float = 0.0


@dataclass
class _Sequence:
    lane: int
    target: Target
    method: Method
    state: DecodeState
    out: list[int]
    stopped: bool
    ttft_ms: float
    started_ns: int
    rounds: list[RoundInfo] = field(default_factory=list)


def decode_turn(target: Target, method: Method, prompt_ids: list[int], settings: DecodeSettings,
                generator: torch.Generator | None = None, context: Mapping[str, str] | None = None) -> TurnResult:
    """Decode one turn alone: one lane of `decode`. `context` (what the caller knows of the prompt) reaches the
    method as `state.context`."""
    assert target.slot == 0, "a turn alone decodes in its target model's first slot"
    todo, done = [Turn(prompt_ids, generator, dict(context or {}))], []

    def feed(lane: int, finished: TurnResult | None) -> Turn | None:
        if finished is not None:
            done.append(finished)
        return todo.pop() if todo else None

    decode(target.shared, method, 1, settings, feed)
    return done[0]


def decode(target: TargetModel, method: Method, lanes: int, settings: DecodeSettings, feed: Feed) -> BatchStats:
    """Decode every turn `feed` hands out, `lanes` sequences at a time in slots of `target` (`method` drafts for
    all of them at once; a routed method routes each sequence, then each proposer drafts for the sequences sent
    to it). A method with a loop of its own (`OwnLoop`) decodes its turns one after another, in one lane."""
    if isinstance(method, OwnLoop):
        return _own_loop(method, lanes, settings, feed)
    method.serve(lanes)
    clock = PhaseClock(target.device)
    stats = BatchStats()
    busy: list[_Sequence] = []
    unresolved: list[list[RoundInfo]] = []  # rounds whose phase times are not read yet, with their rows
    t0 = time.perf_counter_ns()

    def done(seq: _Sequence) -> bool:
        return seq.stopped or len(seq.out) >= settings.max_new_tokens

    def resolve() -> None:
        for infos, phases in zip(unresolved, clock.resolve()):
            for info in infos:
                info.phases = phases
        unresolved.clear()

    def fill(lane: int, finished: TurnResult | None, slot: int) -> _Sequence | None:
        """Lane `lane`'s next turn, started in slot `slot` (a turn done at its first token is handed straight
        back); None when the lane has nothing left."""
        while (turn := feed(lane, finished)) is not None:
            seq = _start(target.slots[slot], method, lane, turn, settings, clock)
            stats.tokens += len(seq.out)
            if not done(seq):
                return seq
            finished = _result(seq, target.device)
        return None

    for lane in range(lanes):
        if (seq := fill(lane, None, len(busy))) is not None:
            busy.append(seq)
    while busy:
        clock.start_round()
        infos = _round(target, busy, settings, clock, stats.rounds if lanes > 1 else -1)
        stats.tokens += sum(info.emitted for info in infos)
        clock.end_round()
        unresolved.append(infos)
        stats.rounds += 1
        finished = [s for s in busy if done(s)]
        if finished:
            resolve()
            slots: list[_Sequence | None] = list(busy)
            for seq in finished:  # the lane's next turn takes the slot it leaves
                slots[seq.target.slot] = fill(seq.lane, _result(seq, target.device), seq.target.slot)
            busy = _compact(target, slots)
    resolve()
    sync(target.device)
    stats.wall_ms = (time.perf_counter_ns() - t0) / 1e6
    return stats


def _own_loop(method: OwnLoop, lanes: int, settings: DecodeSettings, feed: Feed) -> BatchStats:
    """`decode` for a method that runs its own loop (`generate` per turn): one turn at a time."""
    assert lanes == 1, "a method with its own loop decodes one sequence at a time"
    stats = BatchStats()
    t0 = time.perf_counter_ns()
    turn = feed(0, None)
    while turn is not None:
        result = method.generate(turn.prompt_ids, settings, turn.generator)
        stats.tokens += len(result.output_ids)
        stats.rounds += len(result.rounds)
        turn = feed(0, result)
    stats.wall_ms = (time.perf_counter_ns() - t0) / 1e6
    return stats


def _round(target: TargetModel, busy: list[_Sequence], settings: DecodeSettings, clock: PhaseClock,
           batch_round: int) -> list[RoundInfo]:
    """One round of every busy sequence; its rows (`RoundInfo`), phases unresolved."""
    n = len(busy)
    states = [s.state for s in busy]
    kv_lens, forwards = [s.target.length for s in busy], [s.target.forwards for s in busy]
    routes = [Route(s.method) for s in busy]
    if isinstance(busy[0].method, Router):  # each sequence its own choice; each proposer then serves its share at once
        with clock.phase("route"):
            routes = [s.method.route(s.state) for s in busy]
        with clock.phase("catchup"):
            _by_proposer([(p, st) for r, st in zip(routes, states) for p in (r.proposer, *r.also)],
                         lambda p, sts: p.catch_up(sts))
    extra = [(r.proposer, st) for r, st in zip(routes, states) if r.proposer.extra_forwards]
    if extra:
        with clock.phase("extra_forward"):
            for proposer, state in extra:
                proposer.extra_forward(state)
    with clock.phase("draft"):
        trees = _by_proposer([(r.proposer, st) for r, st in zip(routes, states)],
                             lambda p, sts: p.propose(sts))
        extras = [r.proposer.verify_extras(st, t) for r, st, t in zip(routes, states, trees)]
    with clock.phase("verify"):
        logits = target.verify([(s.target, s.state.tokens[-1], t, e) for s, t, e in zip(busy, trees, extras)])
    decide = settings.acceptance.accept if settings.acceptance is not None else accept
    with clock.phase("accept"):
        if settings.acceptance is None and settings.temperature <= 0:  # every sequence's in one read
            results = accept_greedy_all(trees, logits, _read_aheads(busy, logits))
        else:
            results = [decide(t, lg, settings.temperature, s.generator) for t, lg, s in zip(trees, logits, states)]
    sizes = [(len(t), max(t.depths()) if len(t) else 0) for t in trees]  # the trees are on the host now
    if (target.invariant and not target.exact_trees and settings.temperature == 0 and settings.acceptance is None
            and not all(t.is_chain for t in trees)):
        trees, logits, results = _exact_paths(target, busy, trees, results, clock)
    infos = []
    with clock.phase("commit"):
        for i, (seq, lg, r) in enumerate(zip(busy, logits, results)):
            new, seq.stopped = cut(r.tokens, settings.stop_ids, settings.max_new_tokens - len(seq.out))
            commit(seq.state, seq.method, seq.out, lg, r.path, new, r.ahead)
            infos.append(RoundInfo(proposer=routes[i].proposer.name, tree_size=sizes[i][0], draft_depth=sizes[i][1],
                                   accepted=r.accepted, emitted=len(new), kv_len=kv_lens[i],
                                   target_forwards=seq.target.forwards - forwards[i], extras=routes[i].extras,
                                   slot=i, batch=n, batch_round=batch_round))
            seq.rounds.append(infos[-1])
    return infos


def open_turn(target: Target, method: Method, prompt_ids: list[int], settings: DecodeSettings,
              generator: torch.Generator | None, context: Mapping[str, str] | None,
              clock: PhaseClock) -> tuple[DecodeState, list[int], bool, float]:
    """Prefill a turn and start its proposer: (state, output so far, stopped, TTFT ms)."""
    method.attach(target)
    t0 = time.perf_counter_ns()
    prefill_logits = target.prefill(prompt_ids, room=settings.max_new_tokens)
    first, ahead = _first_token(method, target, prefill_logits, len(prompt_ids), settings.temperature, generator)
    ttft_ms = (time.perf_counter_ns() - t0) / 1e6  # the token was read on the host: the device is done
    state = DecodeState([*prompt_ids, first], len(prompt_ids), target, settings.temperature, generator, clock,
                        dict(context or {}), prefill_logits, ahead)
    out, stopped = cut([first], settings.stop_ids, settings.max_new_tokens)
    method.start(state)
    return state, out, stopped, ttft_ms


def _first_token(method: Method, target: Target, logits: torch.Tensor, rows: int, temperature: float,
                 generator: torch.Generator | None) -> tuple[int, torch.Tensor | None]:
    """The prefill's token and, for a method that reads ahead, its value at the prompt's last row: one read."""
    if not method.reads_ahead:
        return pick(logits, temperature, generator), None
    last = to_device([rows - 1], target.device, torch.long)
    token, ahead = to_host(pick_on_device(logits, temperature, generator), method.read_ahead(target, logits, last))
    return int(token), ahead


def _read_aheads(busy: list[_Sequence], logits: list[torch.Tensor]) -> list[ReadAhead | None]:
    """For each sequence whose method reads ahead, its value at the round's accepted node (`ReadAhead`)."""
    return [partial(_ahead_at, s, lg) if s.method.reads_ahead else None for s, lg in zip(busy, logits)]


def _ahead_at(seq: _Sequence, logits: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    return seq.method.read_ahead(seq.target, logits.index_select(0, node)[0], node)


def commit(state: DecodeState, method: Method, out: list[int], logits: torch.Tensor, path: list[int],
           new: list[int], ahead: torch.Tensor | None = None) -> None:
    """Keep a round's accepted path (node indices, root first), its emitted tokens `new` and the method's value
    read ahead at the path's last node (None where it was not read)."""
    state.next_logits = logits[path[-1]]
    state.ahead = ahead
    state.target.commit(path)
    state.tokens.extend(new)
    out.extend(new)
    method.observe(state, new)  # a routed method passes it to every proposer


def _start(target: Target, method: Method, lane: int, turn: Turn, settings: DecodeSettings,
           clock: PhaseClock) -> _Sequence:
    """Prefill a turn alone in its slot (the rest of the batch waits, as it would in a serving engine without
    chunked prefill) and start its proposer."""
    state, out, stopped, ttft_ms = open_turn(target, method, turn.prompt_ids, settings, turn.generator, turn.context,
                                             clock)
    return _Sequence(lane, target, method, state, out, stopped, ttft_ms, time.perf_counter_ns())


def _result(seq: _Sequence, device: torch.device) -> TurnResult:
    sync(device)
    decode_ms = (time.perf_counter_ns() - seq.started_ns) / 1e6
    seq.method.finish(seq.state)
    return TurnResult(seq.out, "stop_token" if seq.stopped else "max_new_tokens", seq.ttft_ms, decode_ms, seq.rounds)


def _by_proposer(work: list[tuple[Proposer, DecodeState]], call: Callable) -> list:
    """`call(proposer, states)` once per proposer in `work` (the sequences a router sent to one proposer in one
    call, those it sent to another in a second); the answers back in `work`'s order."""
    groups: dict[int, list[int]] = {}
    for i, (p, _) in enumerate(work):
        groups.setdefault(id(p), []).append(i)
    out: list = [None] * len(work)
    for members in groups.values():
        answers = call(work[members[0]][0], [work[i][1] for i in members])
        for i, answer in zip(members, answers or [None] * len(members)):
            out[i] = answer
    return out


def _compact(target: TargetModel, slots: list[_Sequence | None]) -> list[_Sequence]:
    """Fill the empty slots (None) with the sequences of the last busy slots, so busy slots stay 0..n-1."""
    while slots and slots[-1] is None:
        slots.pop()
    while None in slots:
        hole = slots.index(None)
        target.move(len(slots) - 1, hole)
        slots[hole] = slots.pop()
        while slots and slots[-1] is None:
            slots.pop()
    return slots  # type: ignore[return-value]


def _exact_paths(target: TargetModel, busy: list[_Sequence], trees: list[DraftTree], results: list[Acceptance],
                 clock: PhaseClock) -> tuple[list[DraftTree], list[torch.Tensor], list[Acceptance]]:
    """A batch-invariant target's greedy round with trees: every sequence's accepted path verified again as a
    chain, in one forward (`TargetModel.verify_paths`), and accepted on those logits, which a one-token decode
    would compute. Its time counts as verify and, on its own, as `reverify`."""
    with clock.phase("verify"), clock.phase("reverify"):
        checked = target.verify_paths([(s.target, s.state.tokens[-1], t, r.path)
                                       for s, t, r in zip(busy, trees, results)])
    with clock.phase("accept"):
        chains, logits = [c for c, _ in checked], [lg for _, lg in checked]
        return chains, logits, accept_greedy_all(chains, logits, _read_aheads(busy, logits))
