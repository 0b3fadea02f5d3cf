"""The metric definitions, written once and used by `run`'s summary and by `report`.

- τ (mean acceptance length) = Σ decode tokens / Σ rounds over the group: tokens per target verify,
  bonus included (vLLM's "mean acceptance length"; Spec-Bench's step-weighted "#Mean accepted tokens").
  The prefill's first token is not a round and is not counted. Baseline τ is exactly 1.
- tokens/s of a prompt = its decode tokens / its decode seconds, all turns summed; a group's tokens/s is
  the unweighted mean over prompts (Spec-Bench `speed.py`).
- speedup = mean over shared prompts of the method's tokens/s / the same mean of the baseline's
  (Spec-Bench's ratio of means, not a mean of ratios), on the prompts both runs finished.
- TTFT = prefill + first token, mean over turns.
"""

from __future__ import annotations

import pandas as pd


def per_prompt(prompts: pd.DataFrame) -> pd.DataFrame:
    """One row per prompt (turns summed)."""
    g = prompts.groupby(["prompt_id", "subtask", "category"], sort=False)
    out = g.agg(decode_tokens=("decode_tokens", "sum"), rounds=("rounds", "sum"), decode_ms=("decode_ms", "sum"),
                ttft_ms=("ttft_ms", "mean"), turns=("turn", "count")).reset_index()
    out["tokens_per_s"] = (out.decode_tokens / (out.decode_ms / 1e3)).where(out.decode_ms > 0)
    return out


def summarise(prompts: pd.DataFrame, by: str, baseline: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per-group rows plus an `overall` row: prompts, τ, tokens/s, TTFT, rounds per prompt, speedup."""
    mine = per_prompt(prompts)
    base = per_prompt(baseline).set_index("prompt_id") if baseline is not None and len(baseline) else None
    groups = [(str(k), g) for k, g in mine.groupby(by, sort=False)] + [("overall", mine)]
    rows = []
    for name, g in groups:
        row = {by: name, "prompts": len(g), "tau": g.decode_tokens.sum() / max(g.rounds.sum(), 1),
               "tokens_per_s": g.tokens_per_s.mean(), "ttft_ms": g.ttft_ms.mean(), "rounds": g.rounds.mean(),
               "speedup": float("nan")}
        if base is not None:
            shared = g[g.prompt_id.isin(base.index)]
            if len(shared):
                row["speedup"] = shared.tokens_per_s.mean() / base.loc[shared.prompt_id, "tokens_per_s"].mean()
        rows.append(row)
    return pd.DataFrame(rows)


def group_column(prompts: pd.DataFrame) -> str:
    """Spec-Bench is summarised by its six subtasks; a dataset with one subtask by its categories."""
    return "subtask" if prompts.subtask.nunique() > 1 else "category"


def position_acceptance(rounds: pd.DataFrame, positions: int | None = None) -> pd.DataFrame:
    """Per draft position k = 1..K over rounds that drafted at least one token (vLLM's definitions):

    - `rate`: share of drafting rounds whose accepted length reaches k (accepted_at_pos[k] / num_drafts);
    - `conditional`: P(position k accepted | position k-1 accepted), among rounds whose draft reached depth k.
    """
    drafted = rounds[rounds.tree_size > 0]
    K = positions or (int(drafted.draft_depth.max()) if len(drafted) else 0)
    rows = []
    for k in range(1, K + 1):
        reached = drafted[(drafted.accepted >= k - 1) & (drafted.draft_depth >= k)]
        rows.append({"position": k, "rate": (drafted.accepted >= k).mean() if len(drafted) else float("nan"),
                     "conditional": (reached.accepted >= k).mean() if len(reached) else float("nan")})
    return pd.DataFrame(rows, columns=["position", "rate", "conditional"])


def survival(rounds: pd.DataFrame) -> pd.DataFrame:
    """P(acceptance length ≥ n) for n = 1..max, acceptance length = accepted + bonus (ConFu Fig. 5)."""
    length = rounds.accepted + 1
    top = int(length.max()) if len(length) else 0
    return pd.DataFrame({"length": range(1, top + 1), "share": [(length >= n).mean() for n in range(1, top + 1)]})


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two outputs differ (a length difference counts); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
