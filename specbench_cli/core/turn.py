"""What one decoded turn produces: its settings, its rounds and its result, and the helper the loop and the
outside references share to cut emitted tokens at a stop or the budget (picking a token is acceptance.pick)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specbench_cli.core.acceptance import SyntheticAcceptance


@dataclass(kw_only=True)
class RoundInfo:
    proposer: str
    tree_size: int
    draft_depth: int
    accepted: int  # draft tokens accepted (bonus excluded)
    emitted: int  # tokens this round added to the output (after any stop cut)
    kv_len: int  # target cache length before the round's verify
    target_forwards: int  # target forward passes in the round (1 unless a method needs extra ones)
    extras: dict = field(default_factory=dict)  # the method's own per-round signals (`Route.extras`)
    # Batch > 1 (core/engine.py): the sequence's slot this round, the sequences in the round's forward, and the
    # round's number in the batch (rows of one batch round share its phase times).
    slot: int = 0
    batch: int = 1
    batch_round: int = -1
    phases: dict[str, float] = field(default_factory=dict)  # ms per phase and "wall"


@dataclass
class TurnResult:
    output_ids: list[int]
    stop_reason: str  # "stop_token" | "max_new_tokens"
    ttft_ms: float
    decode_ms: float
    rounds: list[RoundInfo]


@dataclass
class DecodeSettings:
    max_new_tokens: int
    temperature: float
    stop_ids: frozenset[int]
    acceptance: SyntheticAcceptance | None = None  # None: the target decides (lossless); else `--acceptance`


def cut(tokens: list[int], stop_ids: frozenset[int], budget: int) -> tuple[list[int], bool]:
    """Keep tokens up to and including the first stop token, and at most `budget`; say if a stop was hit."""
    for i, t in enumerate(tokens[:budget]):
        if t in stop_ids:
            return tokens[: i + 1], True
    return tokens[:budget], False
