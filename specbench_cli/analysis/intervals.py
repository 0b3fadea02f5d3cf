"""Confidence intervals for the speed figures, the machine's noise, and the regression verdict built on them.

A speedup is Spec-Bench's ratio of means of per-prompt decode rates (`metrics.summarise`). Its uncertainty comes
from which prompts were drawn and from the machine drifting while they ran (on the CI machine three baselines
of the same prompts, run minutes apart, gave clearly different rates). The intervals here are
percentile bootstraps over prompts (Efron & Tibshirani, An Introduction to the Bootstrap, ch. 13): 95 %, 2000
resamples, a fixed seed so that the same records always print the same interval. A prompt is resampled with
all its passes (`run --repeat`), so passes of one prompt are never treated as independent prompts. The plain
percentile interval is too narrow on a dozen prompts (it covered the true speedup 85 times in 100 in
tests/test_intervals.py's noise model), so its tails are taken at the expanded level of Hesterberg ("What
Teachers Should Know About the Bootstrap", The American Statistician 69(4), 2015, section 4.2): the quantiles
at Φ(±sqrt(n / (n - 1)) · t(n - 1)) for n prompts.

- **paired**: two runs interleaved prompt by prompt (`run --method a,b`, the same `pairing` id in run.json). A
  resample draws prompts once and takes both runs' rates of those prompts and passes: each pair was measured
  side by side, so the drift they shared cancels in the ratio.
- **unpaired**: runs made one after another. Each run's prompts are resampled on their own; the interval is
  wider, and it still cannot see a drift between the runs (only interleaving removes that).

The regression gate (`verdict`) compares a current speedup with a reference one on the same prompts: one draw
of prompts serves both (`change_interval`), so what is left in the interval is how the two measurements differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd

from specbench_cli.analysis.metrics import UNIT, per_prompt

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0


@dataclass
class Interval:
    value: float  # the point estimate (the statistic on the records as they are)
    low: float
    high: float
    paired: bool
    prompts: int  # prompts resampled (each with all its passes)
    units: int  # measurements: prompts x passes

    def text(self, digits: int = 2) -> str:
        """"1.23 [1.10, 1.31]"; "—" where there was nothing to estimate."""
        return "—" if self.value != self.value else f"{self.value:.{digits}f} {self.range(digits)}"

    def range(self, digits: int = 2) -> str:
        """"[1.10, 1.31]"."""
        return "—" if self.low != self.low else f"[{self.low:.{digits}f}, {self.high:.{digits}f}]"

    @property
    def pairing(self) -> str:
        return "paired" if self.paired else "unpaired"

    def labelled(self, digits: int = 2) -> str:
        """"[1.10, 1.31] paired" (a speedup's interval, saying how it was made); "—" with nothing to estimate."""
        return f"{self.range(digits)} {self.pairing}" if self.prompts else "—"

    @property
    def half_width(self) -> float:
        """The larger distance from the estimate to a bound, relative to the estimate."""
        return max(self.value - self.low, self.high - self.value) / self.value if self.value else math.nan


NOTHING = Interval(math.nan, math.nan, math.nan, False, 0, 0)


def rates(prompts: pd.DataFrame) -> pd.DataFrame:
    """Per-unit decode rates (a prompt in one pass, turns summed: `metrics.per_prompt`), the rows a speed figure
    averages."""
    units = per_prompt(prompts).rename(columns={"tokens_per_s": "rate"})
    return units.dropna(subset=["rate"])[[*UNIT, "rate"]]


def _draws(prompts: int, rng: np.random.Generator) -> np.ndarray:
    """RESAMPLES draws of `prompts` prompt positions with replacement."""
    return rng.integers(0, prompts, size=(RESAMPLES, prompts))


def _by_prompt(units: pd.DataFrame, order: list) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt (in `order`): the sum of its units' rates and their count."""
    g = units.groupby("prompt_id").rate.agg(["sum", "count"]).reindex(order)
    return g["sum"].to_numpy(float), g["count"].to_numpy(float)


def mean_samples(units: pd.DataFrame, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap samples of the mean rate over units, prompts resampled with all their passes."""
    order = list(dict.fromkeys(units.prompt_id))
    sums, counts = _by_prompt(units, order)
    draw = _draws(len(order), rng)
    return sums[draw].sum(axis=1) / counts[draw].sum(axis=1)


def ratio_samples(mine: pd.DataFrame, base: pd.DataFrame, paired: bool,
                  rng: np.random.Generator) -> tuple[float, np.ndarray, int, int]:
    """The ratio of mean rates on the units both have (the speedup), with its bootstrap samples: paired draws the
    same prompts for both; unpaired draws each run's prompts on its own. Returns (value, samples, prompts, units)."""
    both = mine.merge(base, on=UNIT, suffixes=("", "_base"))
    if both.empty:
        return math.nan, np.full(RESAMPLES, math.nan), 0, 0
    value = both.rate.mean() / both.rate_base.mean()
    order = list(dict.fromkeys(both.prompt_id))
    if paired:
        draw = _draws(len(order), rng)
        top, count = _by_prompt(both, order)
        bottom, _ = _by_prompt(both.assign(rate=both.rate_base), order)
        samples = top[draw].sum(axis=1) / bottom[draw].sum(axis=1)  # the counts cancel: the same units
    else:
        samples = (mean_samples(both[[*UNIT, "rate"]], rng)
                   / mean_samples(both[UNIT].assign(rate=both.rate_base), rng))
    return value, samples, len(order), len(both)


def student_t(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (Cornish-Fisher expansion around the normal;
    within 0.8 % of the exact 97.5 % quantile at df = 3 and 0.05 % from df = 8 on)."""
    z = NormalDist().inv_cdf(p)
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def expanded_tail(prompts: int) -> float:
    """The lower tail probability the expanded percentile interval reads for a LEVEL interval on n prompts."""
    if prompts < 3:
        return 0.0  # two prompts cannot say how widely prompts vary: the interval spans every resample
    alpha = (1 - LEVEL) / 2
    return NormalDist().cdf(-math.sqrt(prompts / (prompts - 1)) * student_t(1 - alpha, prompts - 1))


def bounds(samples: np.ndarray, prompts: int) -> tuple[float, float]:
    tail = expanded_tail(prompts) * 100
    finite = samples[np.isfinite(samples)]
    if not len(finite):
        return math.nan, math.nan
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)


def mean_interval(prompts: pd.DataFrame) -> Interval:
    """tokens/s of a run (the mean of per-prompt rates) with its interval."""
    units = rates(prompts)
    if units.empty:
        return NOTHING
    samples = mean_samples(units, np.random.default_rng(SEED))
    n = units.prompt_id.nunique()
    return Interval(float(units.rate.mean()), *bounds(samples, n), False, n, len(units))


def speedup_interval(prompts: pd.DataFrame, baseline: pd.DataFrame, paired: bool) -> Interval:
    """The speedup over `baseline` (ratio of means on the shared prompts and passes) with its interval."""
    value, samples, n, units = ratio_samples(rates(prompts), rates(baseline), paired, np.random.default_rng(SEED))
    return Interval(value, *bounds(samples, n), paired, n, units)


# ---------------------------------------------------------------------------------------------- throughput
def _request_rate_samples(prompts: pd.DataFrame, rng: np.random.Generator) -> tuple[float, np.ndarray, int, int]:
    """Σ output tokens / Σ request time (TTFT + decode) over a run's prompts, with its bootstrap samples, prompts
    resampled with all their passes. Returns (value, samples, prompts, units)."""
    units = prompts.assign(seconds=(prompts.ttft_ms + prompts.decode_ms) / 1e3).groupby(UNIT, sort=False).agg(
        tokens=("new_tokens", "sum"), seconds=("seconds", "sum")).reset_index()
    units = units[units.seconds > 0]
    if units.empty:
        return math.nan, np.full(RESAMPLES, math.nan), 0, 0
    order = list(dict.fromkeys(units.prompt_id))
    tokens, _ = _by_prompt(units.assign(rate=units.tokens), order)
    seconds, _ = _by_prompt(units.assign(rate=units.seconds), order)
    draw = _draws(len(order), rng)
    return tokens.sum() / seconds.sum(), tokens[draw].sum(axis=1) / seconds[draw].sum(axis=1), len(order), len(units)


def throughput_interval(prompts: pd.DataFrame, throughput: float) -> Interval:
    """A run's throughput (output tokens over the run's wall time, `scaling.throughput`) with an interval from
    how its requests vary: the bootstrap spread of Σ tokens / Σ request time over its prompts, relative to its
    value, applied to the throughput. With a level's requests in flight together each request holds its share
    of the wall time while it runs, so the two rates move together; one run's wall time has no spread of its own
    to resample. Unpaired: each level is a run of its own."""
    value, samples, n, units = _request_rate_samples(prompts, np.random.default_rng(SEED))
    return Interval(throughput, *bounds(throughput * samples / value, n), False, n, units)


def throughput_ratio_interval(mine: pd.DataFrame, mine_throughput: float, base: pd.DataFrame,
                              base_throughput: float) -> Interval:
    """The ratio of two runs' throughputs (a speedup at one load level) with its unpaired interval: each run's
    relative spread (`throughput_interval`) drawn on its own."""
    rng = np.random.default_rng(SEED)
    value, samples, n, units = _request_rate_samples(mine, rng)
    value_b, samples_b, n_b, _ = _request_rate_samples(base, rng)
    ratio = mine_throughput / base_throughput
    return Interval(ratio, *bounds(ratio * (samples / value) / (samples_b / value_b), min(n, n_b)), False, n, units)


# ---------------------------------------------------------------------------------------------- noise
def noise_from_passes(baseline: pd.DataFrame) -> Interval:
    """Without an A/A pair, a baseline of several passes measures the noise against itself: the odd passes over
    the even ones, prompt by prompt (paired: the same prompts). NOTHING with fewer than two passes."""
    value, samples, n, count = pass_ratio_samples(baseline, np.random.default_rng(SEED))
    return Interval(value, *bounds(samples, n), True, n, count) if n else NOTHING


def pass_ratio_samples(prompts: pd.DataFrame, rng: np.random.Generator) -> tuple[float, np.ndarray, int, int]:
    """A run's odd passes over its even ones with its bootstrap samples (`ratio_samples`, paired): a ratio that
    only the machine moves from 1. No samples (prompts 0) with fewer than two passes."""
    units = rates(prompts)
    if units.empty or units.repeat.nunique() < 2:
        return math.nan, np.full(RESAMPLES, math.nan), 0, 0
    odd = units[units.repeat % 2 == 1].assign(repeat=lambda f: f.repeat // 2)
    even = units[units.repeat % 2 == 0].assign(repeat=lambda f: f.repeat // 2)
    return ratio_samples(odd, even, True, rng)


def detectable(noise: Interval) -> float:
    """The smallest speedup difference (a fraction) these records could tell from noise: how far the interval of
    a ratio that should be exactly 1 (an A/A pair) reaches from 1."""
    if noise.low != noise.low:
        return math.nan
    return max(1 - noise.low, noise.high - 1)


# ---------------------------------------------------------------------------------------------- the gate
@dataclass
class Verdict:
    outcome: str  # "pass" | "regression" | "inconclusive"
    ratio: Interval  # current speedup / reference speedup
    passes_needed: int | None = None  # inconclusive: about how many passes (each run) would decide it


def change_interval(current: tuple[pd.DataFrame, pd.DataFrame, bool],
                    reference: tuple[pd.DataFrame, pd.DataFrame, bool]) -> Interval:
    """current speedup / reference speedup, each given as (method prompts, baseline prompts, interleaved), on the
    prompts all four runs have. The same prompts were measured both times, so one draw of prompts serves all four:
    what a prompt set's mix of easy and hard prompts does to a speedup cancels, and what is left is how the two
    measurements of the same prompts differ."""
    frames = [rates(frame) for frame in (*current[:2], *reference[:2])]
    drawn = _same_prompts(frames)
    if drawn is None:
        return NOTHING
    value, samples, n, units = drawn(lambda m, b, rm, rb: (m / b) / (rm / rb))
    return Interval(value, *bounds(samples, n), current[2] and reference[2], n, units)


def rate_change_interval(current: pd.DataFrame, reference: pd.DataFrame,
                         reference_passes: tuple[float, np.ndarray, int, int]) -> Interval:
    """tokens/s now / tokens/s of the reference on the prompts both have: the engine's own speed, which a
    speedup over a baseline that slowed alike cannot see. The two runs were made at different times, so nothing
    pairs their measurements: one draw of prompts serves both (the prompt mix cancels), and each draw is
    multiplied by a draw of the drift between two passes of one run, the reference's odd passes over its even
    ones (`reference_passes`, from `pass_ratio_samples`) taken as a factor of either sign, since that ratio
    should be 1 and only the machine moves it. The drift between two nights may be larger than the drift
    between two passes of one night: the gate only calls a regression where the whole interval lies below its
    floor. NOTHING where the reference has one pass (no noise to go by) or no prompt is shared."""
    _, drift, _, noise_prompts = reference_passes
    drawn = _same_prompts([rates(current), rates(reference)])
    if drawn is None or not noise_prompts:
        return NOTHING
    value, samples, n, units = drawn(lambda now, then: now / then)
    signs = np.random.default_rng(SEED + 1).choice([-1.0, 1.0], size=len(drift))
    samples = samples * np.exp(signs * np.log(drift))
    return Interval(value, *bounds(samples, n), False, n, units)


def _same_prompts(frames: list[pd.DataFrame]):
    """For frames of per-unit rates measured on the same prompts: a function that takes how to combine the
    frames' mean rates and returns (its value, its RESAMPLES bootstrap samples with one draw of prompts for every
    frame, prompts, units of the first frame); None where no prompt is in every frame."""
    shared = set.intersection(*(set(f.prompt_id) for f in frames))
    order = [p for p in dict.fromkeys(frames[0].prompt_id) if p in shared]
    if not order:
        return None
    per_prompt_sums = [_by_prompt(f, order) for f in frames]
    units = int(sum(frames[0].prompt_id.isin(shared)))

    def drawn(combine) -> tuple[float, np.ndarray, int, int]:
        def at(draw: np.ndarray) -> np.ndarray:
            return combine(*(sums[draw].sum(axis=-1) / counts[draw].sum(axis=-1) for sums, counts in per_prompt_sums))

        samples = at(_draws(len(order), np.random.default_rng(SEED)))
        return float(at(np.arange(len(order)))), samples, len(order), units

    return drawn


def verdict(change: Interval, threshold: float, passes: int = 1) -> Verdict:
    """A regression only where the whole interval of current/reference lies below 1 - threshold; a pass where it
    lies at or above it; else inconclusive, with about how many passes would narrow the interval enough (its
    width shrinks as 1/sqrt(passes))."""
    floor = 1 - threshold
    if change.value != change.value:
        return Verdict("inconclusive", change)
    if change.high < floor:
        return Verdict("regression", change)
    if change.low >= floor:
        return Verdict("pass", change)
    margin = abs(change.value - floor)
    spread = (change.value - change.low) if change.value >= floor else (change.high - change.value)
    needed = math.ceil(passes * (spread / margin) ** 2) if margin > 0 else None
    return Verdict("inconclusive", change, needed if needed is None or needed <= 100 else None)
