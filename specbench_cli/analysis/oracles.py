"""Oracle paths over trace-replay acceptance lengths (WhiFlash, Section 4).

Replay gives, for every turn, every decode position t (0 = the round right after the prefill's token) and
every drafter d, AL_d(t): the draft tokens d would have accepted had a round started at t. A round that
starts at t emits AL + 1 tokens (the bonus), so a path is a walk t → t + AL_d(t) + 1 until the turn's
T decode tokens are covered, and its τ is T / rounds, the same definition a live run has.

- static d: every round uses d;
- Oracle-Task: per category, the one drafter with the fewest rounds over the category;
- Oracle-Prompt: per prompt (all turns), the drafter with the fewest rounds;
- Oracle-Token: the best drafter at every round in hindsight, i.e. the fewest rounds any per-round choice
  reaches. It is found by dynamic programming over t, not by taking the longest AL each round: a greedy
  choice can land on a position where every drafter fails and end up with more rounds than a static path.
So Oracle-Token ≥ Oracle-Prompt ≥ Oracle-Task ≥ every static drafter, in τ, by construction.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench_cli.analysis.metrics import tau

ORACLES = ("Oracle-Task", "Oracle-Prompt", "Oracle-Token")
TURN = ["prompt_id", "turn"]


def round_starts(al: np.ndarray) -> list[int]:
    """The decode positions where one drafter's rounds start, covering len(al) decode tokens."""
    t, starts = 0, []
    while t < len(al):
        starts.append(t)
        t += int(al[t]) + 1
    return starts


def static_rounds(al: np.ndarray) -> int:
    """Rounds one drafter needs to cover len(al) decode tokens."""
    return len(round_starts(al))


def best_rounds(al: np.ndarray) -> int:
    """Fewest rounds over all per-round drafter choices; al is [drafters, T]."""
    T = al.shape[1]
    best = np.zeros(T + 1, dtype=np.int64)
    for t in range(T - 1, -1, -1):
        best[t] = 1 + min(best[min(t + int(a) + 1, T)] for a in al[:, t])
    return int(best[0])


def paths(replay: pd.DataFrame) -> pd.DataFrame:
    """Rounds and tokens per turn for every static drafter and the three oracles.

    `replay` has one row per (prompt_id, turn, position, drafter) with `accepted`, plus category and subtask.
    Returns rows (path, choice, prompt_id, turn, category, subtask, tokens, rounds)."""
    drafters = sorted(replay.drafter.unique())
    rows = []
    for (pid, turn), g in replay.groupby(TURN, sort=False):
        al = g.pivot(index="position", columns="drafter", values="accepted").sort_index()[drafters].to_numpy().T
        meta = dict(prompt_id=pid, turn=turn, category=g.category.iloc[0], subtask=g.subtask.iloc[0], tokens=al.shape[1])
        rows += [dict(path=d, choice=d, rounds=static_rounds(al[i]), **meta) for i, d in enumerate(drafters)]
        rows.append(dict(path="Oracle-Token", choice="per round", rounds=best_rounds(al), **meta))
    table = pd.DataFrame(rows)
    static = table[table.path.isin(drafters)]
    return pd.concat([table, _choose(static, "prompt_id", "Oracle-Prompt"), _choose(static, "category", "Oracle-Task")],
                     ignore_index=True)


def _choose(static: pd.DataFrame, unit: str, name: str) -> pd.DataFrame:
    """Per `unit`, the static drafter with the fewest rounds in total (ties: the first name)."""
    totals = static.groupby([unit, "path"], sort=True).rounds.sum().reset_index()
    winner = totals.loc[totals.groupby(unit).rounds.idxmin()].set_index(unit).path
    chosen = static[static.path == static[unit].map(winner)].copy()
    chosen["choice"], chosen["path"] = chosen.path, name
    return chosen


def summary(table: pd.DataFrame, by: str) -> pd.DataFrame:
    """τ per path and group (plus `overall`): Σ tokens / Σ rounds."""
    out = []
    for path, g in table.groupby("path", sort=False):
        for name, h in [*((str(k), h) for k, h in g.groupby(by, sort=False)), ("overall", g)]:
            out.append({"path": path, by: name, "tau": tau(h.tokens.sum(), h.rounds.sum())})
    return pd.DataFrame(out)
