"""Trace replay (see ARCHITECTURE.md, "The oracle"): what every drafter would accept at every position.

At temperature 0 every lossless method emits the target's greedy trace, so a drafter's round that starts at
decode position t (committed: prompt + output[:t], root output[t]) accepts exactly the longest path of its
draft that matches output[t+1:]. Replay computes that AL_d(t) for every t without running the target more
than once per turn: one teacher-forced forward over prompt + output gives the target features of every
position, and each drafter is driven through its normal interface (start, propose, observe, finish) with a
view of the target that shows only the committed prefix, advancing one token at a time. A live run of d
therefore shows, round by round, the AL that replay predicts at its start position (tests check it).

Alongside, each position's router signals: the entropy of the target's next-token distribution at the
last committed position and that position's final-layer hidden state (WhiFlash's h_t).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specbench_cli.core.method import DecodeState, Method
from specbench_cli.core.target import Target
from specbench_cli.core.timing import sync
from specbench_cli.core.tree import DraftTree


@dataclass
class Trace:
    """One turn's greedy trace: the templated prompt and the output ids (first token included)."""

    prompt_id: str
    turn: int
    category: str
    subtask: str
    prompt_ids: list[int]
    output_ids: list[int]


@dataclass
class TargetView:
    """What a drafter reads of the target during replay: the committed length and the newest rows."""

    device: torch.device
    length: int
    captured: dict[int, torch.Tensor]


@dataclass
class Walk:
    """One drafter along one trace: at every decode position its AL, its draft's size (tree nodes) and the
    wall time of its propose and observe calls (perf_counter; synchronised on CUDA), what `tune` prices."""

    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)
    branched: list[bool] = field(default_factory=list)  # a tree, not a chain: a batch-invariant target re-verifies
    draft_ms: list[float] = field(default_factory=list)
    infos: list[dict] = field(default_factory=list)  # `draft_info` at every position (drafters that give one)


@dataclass
class TurnReplay:
    walks: dict[str, Walk]  # drafter -> its walk over decode positions 0..T-1
    entropy: torch.Tensor  # [T] nats, at the last committed position of each round start
    hidden: torch.Tensor  # [T, H] final-layer hidden state there


@torch.inference_mode()
def teacher_forced(target: Target, sequence: list[int]) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """Every hooked layer's rows for the whole sequence, and the next-token entropy at every position."""
    target.prefill(sequence)
    rows = dict(target.captured)
    last = rows[target.num_layers - 1]
    model = target.model
    entropies = []
    for chunk in last.split(256):  # never all positions × vocabulary at once
        logp = torch.log_softmax(model.lm_head(model.model.norm(chunk[None]))[0].float(), dim=-1)
        entropies.append(-(logp.exp() * logp).sum(-1))
    return rows, torch.cat(entropies)


def replay_turn(target: Target, drafters: dict[str, Method], trace: Trace, cold_drafts: bool = False) -> TurnReplay:
    for d in drafters.values():
        d.attach(target)
    target.capture([target.num_layers - 1])
    seq = trace.prompt_ids + trace.output_ids
    P, T = len(trace.prompt_ids), len(trace.output_ids) - 1
    rows, entropy = teacher_forced(target, seq)
    context = {"category": trace.category, "subtask": trace.subtask, "prompt_id": trace.prompt_id}
    # `cold_drafts`: before each round start of a drafter's walk, an untimed one-row forward of the target (written
    # past the teacher-forced sequence, nothing committed), so that the drafter's weights are as cold as after a
    # live round's verify: on the embedded model in bf16 a one-token EAGLE-3 draft took about twice as long after a
    # target forward as hot, and as long as in a live run
    forward = (lambda: target.verify(seq[-1], DraftTree.chain([]))) if cold_drafts else None
    walks = {name: _walk(d, rows, seq, P, T, context, target.device, forward) for name, d in drafters.items()}
    at = slice(P - 1, P - 1 + T)  # round t starts after committing position P+t-1
    return TurnReplay(walks, entropy[at].cpu(), rows[target.num_layers - 1][at].float().cpu())


def _walk(drafter: Method, rows: dict[int, torch.Tensor], seq: list[int], P: int, T: int, context: dict[str, str],
          device: torch.device, before_round: Callable[[], object] | None = None) -> Walk:
    """Drive one drafter along the trace, one committed token per step: AL, draft size and draft time at every
    position, and what the drafter tells of each draft (`draft_info`). `before_round` runs, untimed, before the
    positions where this drafter's live rounds would start (`analysis.oracles.round_starts`)."""
    view = TargetView(device, P, {i: r[:P] for i, r in rows.items()})
    state = DecodeState(seq[:P + 1], P, view, 0.0, None, None, context)  # type: ignore[arg-type]
    drafter.start(state)
    walk = Walk()
    next_round = 0
    for t in range(T):
        if before_round is not None and t == next_round:
            before_round()
            sync(device)
        t0 = time.perf_counter()
        (tree,) = drafter.propose([state])
        sync(device)
        spent = time.perf_counter() - t0
        walk.accepted.append(tree.matched(seq[P + t + 1:]))
        if t == next_round:
            next_round = t + walk.accepted[-1] + 1
        walk.drafted.append(len(tree))
        walk.branched.append(not tree.is_chain)
        info = drafter.draft_info(state)
        if info is not None:
            walk.infos.append(info)
        view.captured = {i: r[P + t: P + t + 1] for i, r in rows.items()}  # the committed root's rows
        view.length = P + t + 1
        state.tokens.append(seq[P + t + 1])
        t0 = time.perf_counter()
        drafter.observe(state, [seq[P + t + 1]])
        sync(device)
        walk.draft_ms.append((spent + time.perf_counter() - t0) * 1e3)
    drafter.finish(state)
    return walk

