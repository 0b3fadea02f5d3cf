"""Where a round's time goes, from the per-round phase columns of rounds.parquet.

Parts of a round: route, catchup, draft (split into the proposer's body and its output head where the
proposer times its head), verify, accept, commit, and host: the round's host wall time minus the timed
phases (Python between phases, bookkeeping; on CUDA also time the host ran ahead of or behind the
device). The FlashHead thesis' profile (Tables 4.7/4.8) is a regrouping of these parts, see `flashhead_view`.
"""

from __future__ import annotations

import pandas as pd

from specbench_cli.core.timing import PHASES

PARTS = ("route", "catchup", "extra_forward", "draft_body", "draft_head", "verify", "accept", "commit", "host")


def split(rounds: pd.DataFrame) -> pd.DataFrame:
    """Milliseconds per part for every round (columns PARTS plus `round`, the host wall time). A batch round
    (`run --batch-size`) counts once: its rows, one per sequence, share its phase times."""
    if "batch_round" in rounds and (rounds.batch_round >= 0).any():
        rounds = rounds.drop_duplicates(["run", "batch_round"])
    missing = pd.Series(0.0, index=rounds.index)  # a phase added after the run was recorded
    ms = pd.DataFrame({p: rounds.get(f"{p}_ms", missing).fillna(0.0) for p in PHASES})
    head = rounds["draft_head_ms"].fillna(0.0)
    out = ms.drop(columns="draft").assign(draft_body=ms.draft - head, draft_head=head)
    out["host"] = (rounds.wall_ms - ms.sum(axis=1)).clip(lower=0.0)
    out["round"] = rounds.wall_ms
    return out[[*PARTS, "round"]]


def phase_table(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per part: mean, p50 and p95 ms per round and its share (%) of the mean round time."""
    parts = split(rounds)
    mean_round = parts["round"].mean()
    rows = [{"part": p, "mean_ms": parts[p].mean(), "p50_ms": parts[p].quantile(0.5), "p95_ms": parts[p].quantile(0.95),
             "share_pct": 100 * parts[p].mean() / mean_round if mean_round else float("nan")}
            for p in [*PARTS, "round"]]
    return pd.DataFrame(rows)


CONTEXT_BIN = 128  # tokens of cached context per bin of `draft_by_context`
MIN_BIN_ROUNDS = 10  # a bin with fewer rounds is left blank


def draft_by_context(rounds: pd.DataFrame, bin_tokens: int = CONTEXT_BIN,
                     min_rounds: int = MIN_BIN_ROUNDS) -> dict[str, float]:
    """Median drafting ms a round (the proposer's whole draft, its head included) per bin of the target's cached
    context at the round (`kv_len`), keyed by the bin's first token, bins of at least `min_rounds` rounds; and
    "spread", the largest bin median over the smallest. A drafter whose per-round work grows with the context
    (attention over its own cache without a bound, a host copy of the context) shows here, where the phase means
    average it away. Rounds that did not draft (a router's baseline rounds) are left out."""
    drafted = rounds[rounds.tree_size > 0]
    bins = (drafted.kv_len // bin_tokens) * bin_tokens
    counts = drafted.groupby(bins).draft_ms.agg(["median", "size"])
    medians = counts[counts["size"] >= min_rounds]["median"]
    out = {int(start): float(ms) for start, ms in medians.items()}
    if len(medians) > 1 and medians.min() > 0:
        out["spread"] = float(medians.max() / medians.min())
    return out


def flashhead_view(table: pd.DataFrame) -> dict[str, float]:
    """The FlashHead thesis' profile (Tables 4.7/4.8) from a phase table:

    draft-propose, base-verify and finalize (accept + commit) shares of the round; the head's share inside
    the proposal; and the head-only ceiling, the speedup a free head would give (Amdahl: 1 / (1 - head share))."""
    share = table.set_index("part").share_pct / 100
    draft = share.draft_body + share.draft_head
    return {"draft-propose share %": 100 * draft, "base-verify share %": 100 * share.verify,
            "finalize share %": 100 * (share.accept + share.commit),
            "head share of proposal %": 100 * share.draft_head / draft if draft else float("nan"),
            "head-only ceiling ×": 1 / (1 - share.draft_head) if share.draft_head < 1 else float("inf")}
