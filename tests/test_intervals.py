"""The speed figures' intervals and the regression gate, on synthetic records from a known noise model: every
prompt has its own difficulty, the machine drifts as a random walk while a run goes (1 % per measurement), each
measurement has its own 5 % jitter, and each night's machine runs at its own level (10 %). Runs are interleaved
as `run --method baseline,m --repeat N` makes them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specbench_cli.analysis import intervals as I


def interleaved(rng: np.random.Generator, prompts: int, passes: int, speedup: float, drift: float = 0.01,
                jitter: float = 0.05, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(method prompts, baseline prompts) of one interleaved run: each prompt decoded by both, the order rotated.
    The prompts (their difficulty and how much the method speeds each up) are fixed by `seed`, as a benchmark's
    selection is from night to night; the machine is drawn from `rng`."""
    fixed = np.random.default_rng(seed)
    difficulty = 20 * np.exp(fixed.normal(0, 0.3, prompts))
    speedup = speedup * np.exp(fixed.normal(0, 0.2, prompts))  # easy and hard prompts for the drafter
    night = np.exp(rng.normal(0, 0.1))
    units = passes * prompts
    walk = np.exp(np.cumsum(rng.normal(0, drift, 2 * units))).reshape(units, 2)
    first_is_method = np.arange(units) % 2 == 1
    machine = np.where(first_is_method[:, None], walk, walk[:, ::-1])  # column 0: the method's time, 1: baseline's
    base = np.tile(difficulty, passes) * night
    method_rate = base * np.tile(speedup, passes) * machine[:, 0] * np.exp(rng.normal(0, jitter, units))
    base_rate = base * machine[:, 1] * np.exp(rng.normal(0, jitter, units))
    frame = pd.DataFrame({"prompt_id": np.tile(np.arange(prompts).astype(str), passes),
                          "repeat": np.repeat(np.arange(passes), prompts), "turn": 0, "subtask": "s",
                          "category": "c", "decode_tokens": 100, "rounds": 50, "ttft_ms": 1.0})
    return frame.assign(decode_ms=100 / method_rate * 1e3), frame.assign(decode_ms=100 / base_rate * 1e3)


def outcomes(prompts: int, passes: int, change: float, trials: int, threshold: float = 0.05) -> dict[str, float]:
    rng = np.random.default_rng(7)
    seen = {"pass": 0, "regression": 0, "inconclusive": 0}
    for _ in range(trials):
        reference = interleaved(rng, prompts, passes, 1.3)
        current = interleaved(rng, prompts, passes, 1.3 * (1 - change))
        seen[I.verdict(I.change_interval((*current, True), (*reference, True)), threshold, passes).outcome] += 1
    return {k: v / trials for k, v in seen.items()}


@pytest.mark.slow
def test_the_gate_rarely_cries_wolf_and_catches_a_real_regression():
    """At the README's nightly size (12 prompts x 5 passes, interleaved): A/A comparisons fail at most 5 % of the
    time, a real 10 % regression is caught at least 90 % of the time (threshold 5 %)."""
    assert outcomes(12, 5, 0.0, 200)["regression"] <= 0.05
    assert outcomes(12, 5, 0.10, 200)["regression"] >= 0.90


def test_an_interleaved_interval_is_narrower_than_an_unpaired_one():
    rng = np.random.default_rng(3)
    method, base = interleaved(rng, 12, 3, 1.3, drift=0.03)
    paired, unpaired = I.speedup_interval(method, base, True), I.speedup_interval(method, base, False)
    assert paired.value == unpaired.value
    assert paired.low <= paired.value <= paired.high
    assert paired.high - paired.low < unpaired.high - unpaired.low
    assert paired.prompts == 12 and paired.units == 36


def test_the_interval_covers_the_true_speedup_about_95_percent_of_the_time():
    """Each trial draws a new prompt set (`seed`): the speedup's interval is about which prompts were drawn."""
    rng = np.random.default_rng(11)
    covered = 0
    for trial in range(100):
        method, base = interleaved(rng, 12, 3, 1.3, seed=trial)
        got = I.speedup_interval(method, base, True)
        covered += got.low <= 1.3 <= got.high
    assert covered >= 88  # 95 % nominal


def test_inconclusive_says_how_many_passes_would_decide():
    straddles = I.Interval(0.96, 0.92, 1.00, True, 12, 12)
    got = I.verdict(straddles, 0.05, passes=1)
    assert got.outcome == "inconclusive" and got.passes_needed == 16  # (0.04 / 0.01)^2
    assert I.verdict(I.Interval(0.90, 0.88, 0.93, True, 12, 12), 0.05).outcome == "regression"
    assert I.verdict(I.Interval(0.99, 0.96, 1.02, True, 12, 12), 0.05).outcome == "pass"


def test_noise_from_passes_and_detectable_difference():
    rng = np.random.default_rng(5)
    _, steady = interleaved(rng, 12, 4, 1.0, drift=0.0)
    noise = I.noise_from_passes(steady)
    assert noise.low < 1 < noise.high and 0 < I.detectable(noise) < 0.1
    _, drifting = interleaved(rng, 12, 4, 1.0, drift=0.03)  # passes run at different times: the drift shows
    assert I.detectable(I.noise_from_passes(drifting)) > I.detectable(noise)
    assert I.noise_from_passes(steady[steady.repeat == 0]) is I.NOTHING
