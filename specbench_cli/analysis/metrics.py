"""The metric definitions, written once and used by `run`'s summary and by `report`.

- τ (mean acceptance length) = Σ decode tokens / Σ rounds over the group (`tau`): tokens per target verify,
  bonus included (vLLM's "mean acceptance length"; Spec-Bench's step-weighted "#Mean accepted tokens").
  The prefill's first token is not a round and is not counted. Baseline τ is exactly 1. This token-weighted
  τ is the one every table leads with; `tau_turn_mean` is the other convention in use, the unweighted
  mean over prompt turns of each turn's τ (specdec_bench's Average_AL): long turns weigh less in it.
- tokens/s of a prompt = its decode tokens / its decode seconds, all turns summed; a group's tokens/s is
  the unweighted mean over prompts (Spec-Bench `speed.py`). With `run --repeat` a prompt counts once per pass.
- speedup = mean over shared prompts of the method's tokens/s / the same mean of the baseline's
  (Spec-Bench's ratio of means, not a mean of ratios), on the prompts (and passes) both runs finished.
  `analysis/intervals.py` gives it a bootstrap confidence interval.
- TTFT = prefill + first token, mean over turns.
"""

from __future__ import annotations

import pandas as pd

NAN = float("nan")


def tau(tokens: float, rounds: float) -> float:
    """τ: decoded tokens per round (each round one target verify, its bonus token included); NaN without
    rounds. The one definition of acceptance length: records, summaries, oracles and calibrations call it."""
    return tokens / rounds if rounds else NAN


def tau_turn_mean(prompts: pd.DataFrame) -> float:
    """The mean over prompt turns of each turn's τ (specdec_bench's Average_AL), turns without rounds left out."""
    per_turn = [tau(t, r) for t, r in zip(prompts.decode_tokens, prompts.rounds) if r]
    return sum(per_turn) / len(per_turn) if per_turn else NAN


UNIT = ["prompt_id", "repeat"]  # what a speedup pairs: a prompt in one pass over the selection (`run --repeat`)


def first_pass(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of a run's first pass over the selection (`run --repeat`): what a per-turn comparison of two runs
    reads, one record per prompt turn."""
    return frame[frame.repeat == frame.repeat.min()] if len(frame) else frame


def per_prompt(prompts: pd.DataFrame) -> pd.DataFrame:
    """One row per prompt and pass (turns summed)."""
    if "repeat" not in prompts:
        prompts = prompts.assign(repeat=0)
    g = prompts.groupby([*UNIT, "subtask", "category"], sort=False)
    out = g.agg(decode_tokens=("decode_tokens", "sum"), rounds=("rounds", "sum"), decode_ms=("decode_ms", "sum"),
                ttft_ms=("ttft_ms", "mean"), turns=("turn", "count")).reset_index()
    out["tokens_per_s"] = (out.decode_tokens / (out.decode_ms / 1e3)).where(out.decode_ms > 0)
    return out


def summarise(prompts: pd.DataFrame, by: str, baseline: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per-group rows plus an `overall` row: prompts, τ, tokens/s, TTFT, rounds per prompt, speedup."""
    mine = per_prompt(prompts)
    base = per_prompt(baseline).set_index(UNIT) if baseline is not None and len(baseline) else None
    groups = [(str(k), g) for k, g in mine.groupby(by, sort=False)] + [("overall", mine)]
    rows = []
    for name, g in groups:
        row = {by: name, "prompts": g.prompt_id.nunique(), "tau": tau(g.decode_tokens.sum(), g.rounds.sum()),
               "tokens_per_s": g.tokens_per_s.mean(), "ttft_ms": g.ttft_ms.mean(), "rounds": g.rounds.mean(),
               "speedup": float("nan")}
        if base is not None:
            shared = g[pd.MultiIndex.from_frame(g[UNIT]).isin(base.index)]
            if len(shared):
                row["speedup"] = (shared.tokens_per_s.mean()
                                  / base.loc[pd.MultiIndex.from_frame(shared[UNIT]), "tokens_per_s"].mean())
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


def histogram(rounds: pd.DataFrame) -> pd.DataFrame:
    """Share of rounds whose acceptance length (accepted + bonus) is exactly n, n = 1..max (specdec_bench's
    Acceptance_Length_Histogram, as shares)."""
    length = rounds.accepted + 1
    top = int(length.max()) if len(length) else 0
    counts = length.value_counts().reindex(range(1, top + 1), fill_value=0)
    return pd.DataFrame({"length": range(1, top + 1), "share": (counts / max(len(length), 1)).to_numpy()})


def survival(rounds: pd.DataFrame) -> pd.DataFrame:
    """P(acceptance length ≥ n) for n = 1..max, acceptance length = accepted + bonus (ConFu Fig. 5): the
    histogram summed from the right."""
    h = histogram(rounds)
    return h.assign(share=h.share[::-1].cumsum()[::-1].to_numpy())


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two outputs differ (a length difference counts); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def along_response(rounds: pd.DataFrame, bin_tokens: int = 16, min_share: float = 0.25) -> pd.DataFrame:
    """Acceptance by position in the response: per `bin_tokens`-token bin of the tokens a turn had emitted before
    the round, the mean, quartiles and count over turns of each turn's mean tokens per round (accepted + 1);
    bins reached by fewer than `min_share` of the turns are left out (their mean is a few turns')."""
    turn = [c for c in ("run", "prompt_id", "turn", "repeat") if c in rounds]
    ordered = rounds.sort_values([*turn, "round"])
    emitted = ordered.accepted + 1
    position = emitted.groupby([ordered[c] for c in turn]).cumsum() - emitted
    per_turn = emitted.groupby([*(ordered[c] for c in turn), (position // bin_tokens * bin_tokens).rename("bin")]).mean()
    by_bin = per_turn.groupby(level="bin")
    stats = pd.DataFrame({"mean": by_bin.mean(), "q25": by_bin.quantile(0.25), "q75": by_bin.quantile(0.75),
                          "n": by_bin.size()})
    turns = ordered.groupby(turn).ngroups
    return stats[stats.n >= max(1, min_share * turns)]


def replayed(prompts: pd.DataFrame) -> pd.DataFrame:
    """The prompt turns the greedy replay checked (greedy_replay.py); none for runs made before it or without it."""
    if "replay_checked" not in prompts:
        return prompts.iloc[:0]
    return prompts[prompts.replay_checked >= 0]


def engine_error(replayed_turns: pd.DataFrame) -> float:
    """The largest of another engine's measured verify error over its replayed turns (greedy_replay.engine_error);
    NaN where none was measured (our engine's runs, a server's, runs made before it)."""
    if "replay_engine_error" not in replayed_turns:
        return float("nan")
    return float(replayed_turns.replay_engine_error.max())
