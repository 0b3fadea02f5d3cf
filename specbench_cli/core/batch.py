"""Batch > 1: B sequences decoded together, one target forward per round over all of them.

    each free slot takes a turn (its conversation's next turn, else the next conversation) and prefills it alone
    while a slot is busy: draft (all sequences) -> one verify forward over every sequence's tree
                          -> accept, commit (each sequence its own path) -> finished turns leave, slots refill

Each sequence has its own `Target`, a slot of one shared static cache (`BatchTarget`), and its own proposer, a
`Method.fork` of the run's method (the same weights and cross-request caches, per-turn state of its own), so a
proposer sees what it sees at batch 1 and every sequence's output is its batch-1 output: a greedy sequence's
tokens are the target's argmax whatever its neighbours draft. The trees of one round differ in size (a
60-node tree, a chain, an empty draft): they share one forward whose row-wise parts (projections, MLP, head)
run on the nodes alone, packed, and whose attention pads each tree to the largest, padding rows seeing only
themselves and landing past the sequence's committed length, where nothing reads them.

Busy sequences always fill slots 0..n-1 (when a slot empties for good, the sequence in the last busy slot moves
into it), so each forward spans exactly the sequences still decoding; the last rounds of a run, when no turn
is left to start, run with fewer sequences, and say so (`RoundInfo.batch`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from specbench_cli.core.acceptance import Acceptance, accept
from specbench_cli.core.method import DecodeState, Method, Proposer, Route
from specbench_cli.core.target import DEFAULT_BUCKETS, RowsApart, StaticKV, Target
from specbench_cli.core.timing import PhaseClock, sync
from specbench_cli.core.tree import DraftTree
from specbench_cli.core.engine import commit, open_turn
from specbench_cli.core.turn import DecodeSettings, RoundInfo, TurnResult, cut


class BatchTarget:
    """`size` single-sequence targets over one static cache with `size` slots, and the batched verify.

    Compiled (`compile`, GPU): every verify has the shape [size, bucket]: all `size` sequences (idle slots
    verify a one-token dummy whose rows nobody keeps), each tree padded to the smallest bucket that fits the
    round's largest, row-wise parts over the padded rows too (the eager verify's packing by `real` would make
    shapes vary); the graph leaves the cache alone and the host writes each busy
    sequence's rows (`core.target.RowsApart`). One graph per bucket."""

    def __init__(self, model: torch.nn.Module, device: torch.device, size: int, invariant: bool = False,
                 compile: str | None = None, buckets: tuple[int, ...] = DEFAULT_BUCKETS,
                 packed: bool | None = None) -> None:
        self.kv = StaticKV(model, size)
        self.slots = [Target(model, device, invariant=invariant, kv=self.kv, slot=b, packed=packed)
                      for b in range(size)]
        self.device = device
        self.invariant = invariant
        # the compiled forward's own target: its methods, capture set and bucket book-keeping, never a sequence
        self.shape = None if compile is None else Target(model, device, compile, buckets, kv=self.kv)
        self._compiled: Callable | None = None
        self._capacity: int | None = None  # the cache capacity the graphs were compiled for

    def plan(self, tokens: int) -> None:
        """Size the cache for sequences of up to `tokens` positions before anything is timed."""
        self.slots[0].plan(tokens)

    @torch.inference_mode()
    def verify(self, work: list[tuple[int, DraftTree]]) -> list[torch.Tensor]:
        """Slots 0..n-1 verify their (root, tree) in one forward: logits [1 + nodes, V] per slot.

        A node sees its own sequence's cached prefix, itself and its ancestors, at position prefix + depth (what
        `Target.verify` does for one sequence). The row-wise parts of the forward (projections, MLP, head) run on
        the trees' nodes alone, packed; attention pads each tree to the largest."""
        if self.shape is not None:
            return self._verify_compiled(work)
        targets = self.slots[:len(work)]
        sizes = [1 + len(tree) for _, tree in work]
        rows = max(sizes)
        for t in targets:
            t._grow(t.offset + t.length + rows)
        ids, positions, block = _layout(work, len(work), rows)
        base = torch.tensor([t.offset + t.length for t in targets])
        first = targets[0]
        kv_len = first._kv_span(int(base.max()) + rows)
        device = self.device
        base, block = base.to(device), block.to(device)
        sees_reserved = torch.zeros(len(work), rows, dtype=torch.bool, device=device)
        mask = first.visibility(block, sees_reserved, base, kv_len)
        slots = base[:, None] + torch.arange(rows, device=device)
        real = (torch.arange(rows)[None] < torch.tensor(sizes)[:, None]).to(device)  # the rows that are tree nodes
        embeds = first.model.get_input_embeddings()(ids.to(device)[real])[None]  # packed: no padding rows
        hidden, captured = first.decoder(embeds, (positions.to(device) + base[:, None])[real][None], mask, slots,
                                         sees_reserved, lambda i: self.kv.layer(i)[:, :len(work), :, :kv_len], real)
        logits = first._head(hidden[0]).split(sizes)
        captured = [c[0].split(sizes) for c in captured]
        for b, t in enumerate(targets):
            t.forwards += 1
            t.captured = {i: c[b] for i, c in zip(t._capture, captured)}
            t.side_hidden = None
        return list(logits)

    def _verify_compiled(self, work: list[tuple[int, DraftTree]]) -> list[torch.Tensor]:
        shape, size = self.shape, len(self.slots)
        sizes = [1 + len(tree) for _, tree in work]
        rows = shape.bucket(max(sizes))
        for t in self.slots[:len(work)]:
            t._grow(t.offset + t.length + rows)
        if self._capacity is not None and self.kv.capacity != self._capacity and not shape._warming:
            shape.late_compiles.append(f"cache grown to {self.kv.capacity}")  # a new graph inside a round
            self._capacity = self.kv.capacity
        ids, positions, block = _layout(work, size, rows)  # idle slots: one dummy row each, seeing itself
        base = torch.tensor([t.offset + t.length for t in self.slots[:len(work)]] + [0] * (size - len(work)))
        shape._capture = self.slots[0]._capture  # what the methods asked the slots for
        if self._compiled is None:
            self._compiled = shape.compiled(self._step)
        shape.note_bucket(rows)
        embeds = shape.model.get_input_embeddings()(ids.to(self.device)).to(shape._dtype)
        logits, captured, written = self._compiled(embeds, positions.to(self.device) + base[:, None].to(self.device),
                                                   block.to(self.device), base.to(self.device))
        out = []
        for b, (t, m) in enumerate(zip(self.slots, sizes)):
            t._write(written, t.offset + t.length, lane=b)
            t.forwards += 1
            t.captured = {i: c[b, :m].clone() for i, c in zip(t._capture, captured)}
            t.side_hidden = None
            out.append(logits[b, :m].clone())  # CUDA-graph outputs are overwritten by the next replay
        return out

    def _step(self, embeds: torch.Tensor, positions: torch.Tensor, block: torch.Tensor, base: torch.Tensor):
        """The compiled forward over [size, bucket] rows: logits, captured layers, the rows' keys and values
        (written by the host)."""
        shape = self.shape
        sees_reserved = torch.zeros(block.shape[:2], dtype=torch.bool, device=block.device)
        mask = shape.visibility(torch.zeros_like(block), sees_reserved, base, self.kv.capacity)  # the prefixes alone
        slots = base[:, None] + torch.arange(block.shape[1], device=block.device)
        apart = RowsApart(block, [])
        hidden, captured = shape.decoder(embeds, positions, mask, slots, sees_reserved, self.kv.layer, apart=apart)
        return shape._head(hidden), captured, torch.stack(apart.written)

    def warm_up(self) -> dict[int, float]:
        """Compile every bucket for the whole batch now (on throwaway one-token prompts, inside the planned
        cache), so no timed round pays for it; seconds per bucket."""
        if self.shape is None:
            return {}

        def run(rows: int) -> None:
            for t in self.slots:
                t.prefill([0], room=0)
            self.verify([(0, DraftTree.chain([0] * (rows - 1)))] * len(self.slots))

        seconds = self.shape.warm_buckets(self.shape.buckets, run)
        for t in self.slots:
            t.length = 0
        self._capacity = self.kv.capacity
        return seconds

    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """The sequence in slot `src` moves to the free slot `dst` (its cache entries and its target)."""
        t = self.slots[src]
        self.kv.copy_slot(src, dst, t.offset + t.length)
        self.slots[src], self.slots[dst] = self.slots[dst], t
        self.slots[src].slot, t.slot = src, dst


@dataclass
class Turn:
    """One turn to decode, as `decode_turn` takes it: its prompt ids, its own generator (so a sequence samples what
    it samples at batch 1) and what the method may know of the prompt (`DecodeState.context`)."""

    prompt_ids: list[int]
    generator: torch.Generator | None = None
    context: Mapping[str, str] = field(default_factory=dict)


# feed(lane, finished): the caller's scheduler. Called with None when lane `lane` (a sequence stream, which keeps
# its number while its slot changes) first asks for work, then with each turn it finishes; returns the lane's next
# turn (a conversation's next turn stays on its lane) or None when there is nothing left for it.
Feed = Callable[[int, "TurnResult | None"], "Turn | None"]


@dataclass
class BatchStats:
    """What the batch decoded: rounds, tokens emitted (first tokens included) and the wall time of it all
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


def decode_batch(batch: BatchTarget, methods: list[Method], settings: DecodeSettings, feed: Feed) -> BatchStats:
    """Decode every turn `feed` hands out, `len(methods)` sequences at a time (`methods[i]` drafts for lane i; a
    proposer's `propose_batch` drafts for all the sequences it serves at once; a routed method routes each
    sequence, then each proposer drafts for the sequences sent to it)."""
    clock = PhaseClock(batch.device)
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
            seq = _start(batch.slots[slot], methods[lane], lane, turn, settings, clock)
            stats.tokens += len(seq.out)
            if not done(seq):
                return seq
            finished = _result(seq, batch.device)
        return None

    for lane in range(len(methods)):
        if (seq := fill(lane, None, len(busy))) is not None:
            busy.append(seq)
    while busy:
        clock.start_round()
        n = len(busy)
        states = [s.state for s in busy]
        routes = [Route(s.method) for s in busy]
        if methods[0].routed:  # each sequence its own choice; each proposer then serves its share at once
            with clock.phase("route"):
                routes = [s.method.route(s.state) for s in busy]
            with clock.phase("catchup"):
                _by_proposer([(p, st) for r, st in zip(routes, states) for p in (r.proposer, *r.also)],
                             lambda ps, sts: ps[0].catch_up_batch(ps, sts))
        with clock.phase("draft"):
            trees = _by_proposer([(r.proposer, st) for r, st in zip(routes, states)],
                                 lambda ps, sts: ps[0].propose_batch(ps, sts))
        sizes = [(len(t), max(t.depths()) if len(t) else 0) for t in trees]
        kv_lens = [s.target.length for s in busy]
        with clock.phase("verify"):
            logits = batch.verify([(s.tokens[-1], t) for s, t in zip(states, trees)])
        with clock.phase("accept"):
            results = [accept(t, lg, settings.temperature, s.generator) for t, lg, s in zip(trees, logits, states)]
        if batch.invariant and settings.temperature == 0 and not all(t.is_chain for t in trees):
            trees, logits, results = _exact_paths(batch, states, trees, results, clock)
        infos = []
        with clock.phase("commit"):
            for i, (seq, lg, r) in enumerate(zip(busy, logits, results)):
                new, seq.stopped = cut(r.tokens, settings.stop_ids, settings.max_new_tokens - len(seq.out))
                commit(seq.state, seq.method, seq.out, lg, r.path, new)
                stats.tokens += len(new)
                infos.append(RoundInfo(proposer=routes[i].proposer.name, tree_size=sizes[i][0],
                                       draft_depth=sizes[i][1], accepted=r.accepted, emitted=len(new),
                                       kv_len=kv_lens[i], target_forwards=1, extras=routes[i].extras, slot=i, batch=n,
                                       batch_round=stats.rounds))
                seq.rounds.append(infos[-1])
        clock.end_round()
        unresolved.append(infos)
        stats.rounds += 1
        finished = [s for s in busy if done(s)]
        if finished:
            resolve()
            slots: list[_Sequence | None] = list(busy)
            for seq in finished:  # the lane's next turn takes the slot it leaves
                slots[seq.target.slot] = fill(seq.lane, _result(seq, batch.device), seq.target.slot)
            busy = _compact(batch, slots)
    resolve()
    sync(batch.device)
    stats.wall_ms = (time.perf_counter_ns() - t0) / 1e6
    return stats


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


def _layout(work: list[tuple[int, DraftTree]], size: int, rows: int) -> tuple[torch.Tensor, ...]:
    """Token ids, depths and ancestor masks [size, rows(, rows)] of the (root, tree) pairs of `work` in its first
    slots; padding rows and slots past `work` see only themselves."""
    ids = torch.zeros(size, rows, dtype=torch.long)
    positions = torch.zeros(size, rows, dtype=torch.long)
    block = torch.eye(rows, dtype=torch.bool).repeat(size, 1, 1)
    for b, (root, tree) in enumerate(work):
        m = 1 + len(tree)
        ids[b, :m] = torch.tensor([root, *tree.tokens])
        positions[b, :m] = torch.tensor(tree.depths())
        block[b, :m, :m] = tree.ancestor_mask()
    return ids, positions, block


def _by_proposer(work: list[tuple[Proposer, DecodeState]], call: Callable) -> list:
    """`call(proposers, states)` once per kind of proposer in `work` (the sequences a router sent to one proposer in
    one call, those it sent to another in a second); the answers back in `work`'s order."""
    groups: dict[tuple[type, str], list[int]] = {}
    for i, (p, _) in enumerate(work):
        groups.setdefault((type(p), p.name), []).append(i)
    out: list = [None] * len(work)
    for members in groups.values():
        answers = call([work[i][0] for i in members], [work[i][1] for i in members])
        for i, answer in zip(members, answers or [None] * len(members)):
            out[i] = answer
    return out


def _compact(batch: BatchTarget, slots: list[_Sequence | None]) -> list[_Sequence]:
    """Fill the empty slots (None) with the sequences of the last busy slots, so busy slots stay 0..n-1."""
    while slots and slots[-1] is None:
        slots.pop()
    while None in slots:
        hole = slots.index(None)
        batch.move(len(slots) - 1, hole)
        slots[hole] = slots.pop()
        while slots and slots[-1] is None:
            slots.pop()
    return slots  # type: ignore[return-value]


def _exact_paths(batch: BatchTarget, states: list[DecodeState], trees: list[DraftTree], results: list[Acceptance],
                 clock: PhaseClock) -> tuple[list[DraftTree], list[torch.Tensor], list[Acceptance]]:
    """A batch-invariant target's greedy round with trees: every sequence's accepted path verified again as a
    chain, in one forward (`core.engine._exact_path` for a batch)."""
    chains = [tree.along(r.path) for tree, r in zip(trees, results)]
    with clock.phase("verify"), clock.phase("reverify"):
        logits = batch.verify([(s.tokens[-1], c) for s, c in zip(states, chains)])
    with clock.phase("accept"):
        return chains, logits, [accept(c, lg, 0.0) for c, lg in zip(chains, logits)]
