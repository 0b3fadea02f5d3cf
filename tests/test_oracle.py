"""Oracle paths over hand-made replay acceptance lengths with known answers, and their ordering."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from specbench_cli.analysis import oracles as oracle
from specbench_cli.analysis import report
from specbench_cli.analysis.results import load

# Per prompt (category), per drafter: AL at decode positions 0..5 (six decode tokens per turn).
REPLAY = {
    ("P1", "x"): {"a": [3, 0, 0, 0, 0, 0], "b": [2, 0, 0, 2, 0, 0]},  # a: 3 rounds (greedy trap), b: 2
    ("P2", "x"): {"a": [1, 0, 3, 0, 0, 0], "b": [0, 0, 0, 0, 0, 0]},  # a: 2 rounds, b: 6
    ("P3", "y"): {"a": [2, 0, 0, 0, 0, 0], "b": [0, 0, 0, 3, 0, 0]},  # a: 4, b: 4, switching a→b: 2
}


def replay_frame() -> pd.DataFrame:
    rows = [dict(prompt_id=p, turn=0, category=c, subtask=c, position=t, drafter=d, accepted=a)
            for (p, c), per in REPLAY.items() for d, al in per.items() for t, a in enumerate(al)]
    return pd.DataFrame(rows)


def test_static_and_best_rounds():
    assert oracle.static_rounds(np.array([3, 0, 0, 0, 0, 0])) == 3
    assert oracle.static_rounds(np.array([0, 0, 0, 3, 0, 0])) == 4  # the last round is cut at the turn's end
    # greedy would take a's 3 at t=0 and need 3 rounds; the best choice sequence needs 2
    assert oracle.best_rounds(np.array([[3, 0, 0, 0, 0, 0], [2, 0, 0, 2, 0, 0]])) == 2


def test_oracle_paths_known_answers_and_ordering():
    paths = oracle.paths(replay_frame())
    tau = oracle.summary(paths, "category").set_index(["path", "category"]).tau
    assert tau["a", "x"] == pytest.approx(12 / 5) and tau["b", "x"] == pytest.approx(12 / 8)
    assert tau["Oracle-Task", "x"] == pytest.approx(12 / 5)  # a is the better drafter for category x
    assert tau["Oracle-Prompt", "x"] == pytest.approx(12 / 4)  # b for P1, a for P2
    assert tau["Oracle-Token", "y"] == pytest.approx(6 / 2) and tau["Oracle-Prompt", "y"] == pytest.approx(6 / 4)
    chosen = paths[paths.path == "Oracle-Prompt"].set_index("prompt_id").choice
    assert chosen["P1"] == "b" and chosen["P2"] == "a"
    overall = oracle.summary(paths, "category").query("category == 'overall'").set_index("path").tau
    assert overall["Oracle-Token"] >= overall["Oracle-Prompt"] >= overall["Oracle-Task"] >= max(overall["a"], overall["b"])


def test_random_replays_keep_the_oracle_order():
    rng = np.random.default_rng(0)
    rows = []
    for p in range(12):
        for d in ("a", "b", "c"):
            for t, a in enumerate(rng.geometric(0.3 + 0.2 * (d == "a"), size=40) - 1):
                rows.append(dict(prompt_id=f"p{p}", turn=0, category=f"c{p % 3}", subtask="s", position=t, drafter=d,
                                 accepted=int(a)))
    s = oracle.summary(oracle.paths(pd.DataFrame(rows)), "category").set_index(["path", "category"]).tau
    for group in ("c0", "c1", "c2", "overall"):
        statics = max(s[d, group] for d in "abc")
        assert s["Oracle-Token", group] >= s["Oracle-Prompt", group] >= s["Oracle-Task", group] - 1e-12
        assert s["Oracle-Task", group] >= statics - 1e-12


def test_report_shows_oracle_rows(tmp_path):
    run = tmp_path / "oracle-run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"kind": "oracle", "settings": {"model": "tiny", "dataset": "d"}}))
    replay_frame().to_parquet(run / "replay.parquet")
    (table,) = report.oracle_tables(load([tmp_path]))
    frame = table.frame.set_index("path")
    assert list(frame.index) == ["a", "b", "Oracle-Task", "Oracle-Prompt", "Oracle-Token"]
    assert frame.loc["Oracle-Token", "overall"] == pytest.approx(18 / 6)


def test_draft_parts_read_back_when_one_prompt_never_drafted(tmp_path):
    """A part whose drafts are all empty must not give the column a type the other parts do not share."""
    import torch

    from specbench_cli.commands.oracle.command import ORACLE_TABLES, _parts
    from specbench_cli.commands.oracle.replay import Trace, TurnReplay, Walk
    from specbench_cli.run_folder import RunFolder

    folder = RunFolder(tmp_path, ORACLE_TABLES)
    for table in ORACLE_TABLES:
        (tmp_path / f"{table}.parquet").mkdir()
    for index, draft in enumerate(([], [5, 6])):
        trace = Trace(f"p{index}", 0, "c", "s", [1, 2], [3, 4])
        walk = Walk(accepted=[0], drafted=[len(draft)], branched=[False], draft_ms=[0.1],
                    infos=[{"score": 0.5, "match_len": 1, "draft": draft}])
        turn = TurnReplay({"suffix": walk}, torch.zeros(1), torch.zeros(1, 2))
        folder.write_prompt(index, _parts(index, [trace], [turn]))
    drafts = pd.read_parquet(tmp_path / "drafts.parquet").sort_values("prompt_id")
    assert [list(d) for d in drafts.draft] == [[], [5, 6]] and list(drafts.prompt_len) == [2, 2]
