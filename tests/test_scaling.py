"""The report's load sweep (throughput and speedup against concurrency) and cross-engine step check, on
hand-made runs with known answers."""

from __future__ import annotations

import pytest

from specbench_cli.analysis import cross_engine, scaling
from specbench_cli.analysis.results import load
from tests.fake_runs import Turn, baseline_turns, write_run

VLLM = {"engine": "vllm", "engine_args": {}, "speculative_config": None}


def turns(decode_ms: float) -> list[Turn]:
    return [Turn("p1", "writing", [3, 1, 0, 2], decode_ms), Turn("p2", "writing", [2, 2, 2], decode_ms)]


def sweep(root, levels=(1, 4)):
    """vLLM baseline and eagle3 at each level; the baseline's prompts take twice eagle3's time at c1, the
    same time at c4; eagle3's throughput is recorded (run.json) as 100 tok/s x level."""
    for n in levels:
        settings = {**VLLM, "concurrency": n}
        base_ms = 20.0 if n == 1 else 10.0
        write_run(root / f"base-c{n}", "baseline", baseline_turns(turns(10.0), base_ms / 10), settings=settings)
        write_run(root / f"eagle3-c{n}", "eagle3", turns(10.0), settings=settings,
                  more={"throughput": {"output_tokens_per_s": 100.0 * n, "seconds": 2.0}})


def test_the_throughput_table_divides_by_the_baseline_of_the_same_level(tmp_path):
    sweep(tmp_path)
    frame = scaling.throughput_table(load([tmp_path]), "concurrency").frame.set_index("concurrency")
    # the baseline has no recorded throughput here: new tokens / (TTFT + decode) over its prompts
    base = load([tmp_path / "base-c1"]).groups[0].prompts
    expected = base.new_tokens.sum() / ((base.ttft_ms.sum() + base.decode_ms.sum()) / 1e3)
    assert frame.loc[1, "baseline tok/s"] == pytest.approx(expected)
    assert frame.loc[4, "eagle3 tok/s"] == 400.0
    assert frame.loc[1, "eagle3 ×"] == pytest.approx(100.0 / frame.loc[1, "baseline tok/s"])
    assert frame.loc[4, "eagle3 ×"] == pytest.approx(400.0 / frame.loc[4, "baseline tok/s"])
    assert frame.loc[1, "eagle3 τ"] == pytest.approx((4 + 2 + 1 + 3 + 3 * 3) / 7)
    latency = scaling.latency_table(load([tmp_path]), "concurrency").frame
    assert latency[latency.method == "vllm:eagle3"]["requests/s"].tolist() == [1.0, 1.0]  # 2 requests in 2 s
    low, high = (float(x) for x in frame.loc[4, "eagle3 × 95% CI"].strip("[]").split(","))
    assert low <= frame.loc[4, "eagle3 ×"] <= high


def test_two_runs_of_one_level_pool_their_recorded_tokens_and_seconds(tmp_path):
    """Two runs with the same settings at 4 in flight (a tune's run and its check's): Σ output tokens / Σ
    seconds as recorded (400 / 8 s), neither the mean of their rates (83) nor the one-at-a-time sum of request
    times, which would count overlapping time twice."""
    settings = {**VLLM, "concurrency": 4}
    for i, (tokens, seconds) in enumerate(((300, 2.0), (100, 6.0))):
        write_run(tmp_path / f"eagle3-{i}", "eagle3", turns(10.0), settings=settings,
                  more={"throughput": {"output_tokens": tokens, "output_tokens_per_s": tokens / seconds,
                                       "seconds": seconds}})
    (group,) = [g for g in load([tmp_path]).groups if g.method == "eagle3"]
    assert len(group.dirs) == 2 and scaling.throughput(group) == pytest.approx(400 / 8.0)


def test_throughput_and_its_speedup_carry_intervals_from_how_the_requests_vary(tmp_path):
    """A run whose requests all run at one rate has nothing to resample (its interval is the point); one whose
    requests differ gets an interval around its throughput; the speedup's interval holds the ratio."""
    from specbench_cli.analysis import intervals

    even = [Turn(f"p{i}", "writing", [0] * 9, 90.0, depth=0) for i in range(6)]  # 10 tokens in 100 ms each
    uneven = [Turn(f"p{i}", "writing", [0] * 9, 40.0 * (i + 1), depth=0) for i in range(6)]
    write_run(tmp_path / "even", "baseline", even)
    write_run(tmp_path / "uneven", "eagle3", uneven)
    groups = {g.method: g for g in load([tmp_path]).groups}
    flat = intervals.throughput_interval(groups["baseline"].prompts, 100.0)
    assert (flat.low, flat.value, flat.high) == pytest.approx((100.0, 100.0, 100.0))
    spread = intervals.throughput_interval(groups["eagle3"].prompts, 50.0)
    assert spread.low < 50.0 < spread.high and spread.prompts == 6
    ratio = intervals.throughput_ratio_interval(groups["eagle3"].prompts, 50.0, groups["baseline"].prompts, 100.0)
    assert ratio.low < 0.5 < ratio.high and not ratio.paired


def test_a_run_at_one_request_only_makes_no_load_tables(tmp_path):
    sweep(tmp_path, levels=(1,))
    assert scaling.tables(load([tmp_path])) == []


@pytest.mark.slow
def test_the_load_figure_is_written(tmp_path):
    from specbench_cli.analysis.report import figures

    sweep(tmp_path / "runs", levels=(1, 2, 4))
    written = figures(load([tmp_path / "runs"]), tmp_path / "figs")
    assert tmp_path / "figs" / "throughput_vs_concurrency.png" in written


@pytest.mark.slow
def test_a_batch_size_sweep_has_its_own_table_and_figure(tmp_path):
    """Our engine's --batch-size runs: their own table (DART Tables 5-7) and figure, kept out of the concurrency
    ones; each level divided by the baseline at the same batch size."""
    from specbench_cli.analysis.report import figures

    for n in (1, 2, 8):
        settings = {"batch_size": n} if n > 1 else {}
        more = {"throughput": {"output_tokens_per_s": 50.0 * n, "seconds": 2.0}} if n > 1 else {}
        base = {"throughput": {"output_tokens_per_s": 40.0 * n, "seconds": 2.0}} if n > 1 else {}
        write_run(tmp_path / "runs" / f"base-b{n}", "baseline", baseline_turns(turns(10.0), 1.0), settings=settings,
                  more=base)
        write_run(tmp_path / "runs" / f"suffix-b{n}", "suffix", turns(10.0), settings=settings, more=more)
    results = load([tmp_path / "runs"])
    names = [t.name for t in scaling.tables(results)]
    assert names == ["throughput_vs_batch_size", "latency_vs_batch_size"]
    frame = scaling.throughput_table(results, "batch_size").frame.set_index("batch_size")
    assert frame.loc[8, "suffix tok/s"] == 400.0 and frame.loc[8, "suffix ×"] == pytest.approx(50.0 / 40.0)
    assert len(scaling.throughput_table(results, "concurrency").frame) == 1  # batch 1 only: no sweep there
    written = figures(results, tmp_path / "figs")
    assert tmp_path / "figs" / "throughput_vs_batch_size.png" in written
    assert tmp_path / "figs" / "throughput_vs_concurrency.png" not in written


def pair(root, method: str, engine_accepted: list[int], version: str = "0.32.0"):
    ours = [Turn("p1", "writing", [3, 1, 0, 2], 10.0, ids=list(range(11)))]
    theirs = [Turn("p1", "writing", engine_accepted, 10.0, ids=list(range(11)))]
    write_run(root / "ours", method, ours)
    write_run(root / "vllm", method, theirs, settings={**VLLM, "concurrency": 1},
              more={"engine": {"name": "vllm", "version": version}})
    return cross_engine.table(load([root])).frame


def test_the_cross_engine_table_finds_the_first_step_that_differs(tmp_path):
    frame = pair(tmp_path, "eagle3", [3, 0, 1, 2])
    row = frame.iloc[0]
    assert row["output ids equal"] and not row["accepts equal"]
    assert row["first difference"] == "step 1: ours 1, engine 0" and row["known engine cause"] == "—"


def test_equal_steps_are_equal(tmp_path):
    row = pair(tmp_path, "eagle3", [3, 1, 0, 2]).iloc[0]
    assert row["accepts equal"] and row["first difference"] == "—" and row["steps engine"] == 4


def test_a_known_engine_defect_is_named_not_hidden(tmp_path):
    row = pair(tmp_path, "dflash", [3, 0, 1, 2]).iloc[0]
    assert not row["accepts equal"] and "rms_norm" in row["known engine cause"]
    assert pair(tmp_path / "later", "dflash", [3, 0, 1, 2], version="0.40.1").iloc[0]["known engine cause"] == "—"
