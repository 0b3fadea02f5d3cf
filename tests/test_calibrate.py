"""Calibration maths on hand-made replays: the routed-decode simulation, the threshold sweep, the
break-even ΔAL threshold and the router fit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specbench_methods.predictors import Router
from specbench_cli.commands.calibrate.command import (TABLE2_THRESHOLDS, Latency, break_even_threshold, entropy_grid, entropy_sweep,
                                     fit, simulate, throughput)
from specbench_cli.analysis.oracles import static_rounds

LAT = Latency(eagle3=30.0, other=10.0, catchup_per_token=0.5)


def test_simulate_static_routes_match_the_oracle_paths():
    al_e, al_d = np.array([3, 0, 0, 0, 2, 0, 0, 0]), np.array([0, 1, 0, 1, 0, 0, 0, 0])
    tokens, rounds, ms = simulate(al_e, al_d, np.ones(8, bool), LAT)
    assert (tokens, rounds, ms) == (8, static_rounds(al_e), 30.0 * static_rounds(al_e))
    assert simulate(al_e, al_d, np.zeros(8, bool), LAT)[1:] == (static_rounds(al_d), 10.0 * static_rounds(al_d))


def test_simulate_charges_catch_up_after_an_idle_stretch():
    al_e, al_d = np.zeros(6, int), np.array([1, 0, 0, 0, 0, 0])
    use = np.array([False, False, True, True, True, True])  # dflash covers 0..1, then eagle3 from 2
    tokens, rounds, ms = simulate(al_e, al_d, use, LAT)
    # dflash at 0 (+2), eagle3 at 2 with a backlog of 2 positions, then eagle3 at 3, 4, 5 with none
    assert (tokens, rounds) == (6, 5) and ms == pytest.approx(10 + (30 + 0.5 * 2) + 3 * 30)


def test_entropy_sweep_picks_the_better_drafter_per_category():
    rng = np.random.default_rng(0)
    turns = []
    for i in range(6):
        ent = rng.uniform(0, 2, 40)
        al_e = np.where(ent > 1, 3, 0)  # eagle3 shines where the target is uncertain
        al_d = np.where(ent > 1, 0, 5)
        turns.append({"prompt_id": f"p{i}", "turn": 0, "category": "a" if i % 2 else "b", "al_e": al_e, "al_d": al_d,
                      "entropy": ent, "hidden": np.zeros((40, 8))})
    frame = pd.DataFrame(turns)
    sweep = entropy_sweep(frame, Latency(10.0, 10.0, 0.0), entropy_grid(frame))
    best = sweep.loc[sweep.groupby("category").tokens_per_s.idxmax()].set_index("category")
    assert (0.8 <= best.threshold).all() and (best.threshold <= 1.2).all()
    always = sweep[sweep.threshold == -1.0].set_index("category")
    assert (best.tokens_per_s > always.tokens_per_s).all() and (always.eagle3_share == 1.0).all()
    speed, tau = throughput([(r.al_e, r.al_d, r.entropy > 1.0) for r in frame.itertuples()], Latency(10.0, 10.0, 0.0))
    assert tau > max(throughput([(r.al_e, r.al_d, np.full(40, e)) for r in frame.itertuples()],
                                Latency(10.0, 10.0, 0.0))[1] for e in (True, False))


def test_break_even_threshold():
    assert break_even_threshold(Latency(20.0, 10.0, 0.0), mean_al_d=1.0) == pytest.approx(2.0)
    assert break_even_threshold(Latency(10.0, 10.0, 0.0), mean_al_d=3.0) == 0.0
    assert TABLE2_THRESHOLDS == (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)


@pytest.mark.slow
def test_router_learns_a_linear_signal():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, 64)).astype(np.float32)
    y = (2.0 * x[:, 0] - x[:, 1]).astype(np.float32)
    router = fit(Router, x, y, steps=1500)
    import torch

    with torch.inference_mode():
        pred = router(torch.tensor(x)).numpy()
    assert np.mean((pred - y) ** 2) < 0.25 * np.var(y)
