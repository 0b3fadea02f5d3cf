"""`specbench tune`: pricing candidate budgets on a cost curve, the choice, and `run --tuned`."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench_cli.commands.tune import pricing as tuning

from specbench_cli import budgets
from specbench_cli.cli import app
from specbench_cli.commands.tune.pricing import Costs, choose, predict
from tests.conftest import THREADS, needs_embedded

GPU_LIKE = Costs(10.0, {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.01, 16: 1.02, 32: 1.05, 64: 1.1})  # verify is nearly free
CPU_LIKE = Costs(10.0, {1: 1.0, 2: 1.2, 4: 1.5, 8: 2.0, 16: 3.5, 32: 7.0, 64: 12.0})


def walk(accepted: list[int], drafted: int, draft_ms: float, branched: bool = False) -> pd.DataFrame:
    n = len(accepted)
    return pd.DataFrame({"position": range(n), "accepted": accepted, "drafted": [drafted] * n,
                         "branched": [branched] * n, "draft_ms": [draft_ms] * n})


def test_costs_interpolate_between_and_extend_past_the_measured_sizes():
    assert CPU_LIKE.verify_ms(1) == 10.0 and CPU_LIKE.verify_ms(3) == pytest.approx(13.5)
    assert CPU_LIKE.verify_ms(80) == pytest.approx(10 * (12.0 + 5 / 32 * 16))  # the last slope, 5 per 32 rows


def test_a_candidate_is_priced_by_hand():
    """τ 2 (every round accepts one draft token and the bonus), 4 nodes, 2 ms of drafting: on the CPU-like
    curve a round is 2 + 10·c(5) + (12 − 10) ms of loop = 2 + 16.25 + 2, against a baseline of 12 ms/token."""
    p = predict(("k=4",), [walk([1, 0] * 20, 4, 2.0)], CPU_LIKE, base_ms=12.0, reverifies=False)
    assert p.tau == pytest.approx(2.0) and p.mean_draft == 4
    assert p.verify_ms == pytest.approx(16.25) and p.round_ms == pytest.approx(20.25)
    assert p.speedup == pytest.approx(2 * 12 / 20.25) and p.tokens_per_s == pytest.approx(2 / 20.25 * 1e3)
    assert predict(("k=4",), [walk([1, 0] * 20, 4, 2.0)], CPU_LIKE, 12.0, reverifies=True).verify_ms == 16.25  # a chain
    tree = predict(("k=4",), [walk([1, 0] * 20, 4, 2.0, branched=True)], CPU_LIKE, base_ms=12.0, reverifies=True)
    assert tree.verify_ms == pytest.approx(16.25 + 10 * 1.2)  # every round accepts 1: that path again, c(2)


def test_the_choice_follows_the_machine():
    """A 60-node tree accepting more wins where verify is nearly free and loses where it is not."""
    small = [walk([2, 0, 1] * 30, 8, 3.0)]  # rounds start where 2 are accepted: τ 3
    large = [walk([4, 3, 5] * 30, 60, 9.0)]  # τ 90 / 16
    for costs, winner in ((GPU_LIKE, "total_token=60"), (CPU_LIKE, "total_token=8")):
        options = [predict((f"total_token={n}",), w, costs, base_ms=11.0, reverifies=False)
                   for n, w in ((8, small), (60, large))]
        assert choose(options).candidate == winner


def test_rounds_are_stepped_and_priced_where_a_live_run_drafts():
    """Acceptance [3, 0, 0, 0, 1, 0]: rounds start at 0 (4 tokens) and 4 (2 tokens): τ 3, not the mean AL + 1,
    and the draft sizes and times that count are those at positions 0 and 4."""
    frame = walk([3, 0, 0, 0, 1, 0], 4, 1.0)
    frame["drafted"] = [7, 99, 99, 99, 1, 99]
    frame["draft_ms"] = [2.0, 50, 50, 50, 4.0, 50]
    p = predict((), [frame], CPU_LIKE, 11.0, reverifies=False)
    assert p.tau == pytest.approx(3.0) and p.mean_draft == 4 and p.draft_ms == 3.0
    assert p.verify_ms == pytest.approx((10 * 2.0 + 10 * 1.2) / 2)  # c(8) and c(2)


def test_unknown_method_and_missing_record_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    result = CliRunner().invoke(app, ["tune", "--method", "confu"])
    assert result.exit_code == 2 and "tune has no budgets for 'confu'" in result.output
    result = CliRunner().invoke(app, ["run", "--method", "suffix", "--tuned", "--limit", "1", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "no tuned budget for suffix" in result.output


@pytest.mark.slow
@needs_embedded
def test_tune_chooses_records_and_run_tuned_applies_it(tmp_path, monkeypatch, drawn):
    """A small real tune of suffix on the embedded model: baseline, costs, a replay per candidate, the live
    check, the record; then `run --tuned` decodes with the chosen budget and says where it came from."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(budgets.GRIDS, "suffix", [("max_spec_tokens=4",)])
    monkeypatch.setattr(tuning, "COST_ROWS", (1, 2, 4, 8))
    common = ["--limit", "1", "--max-new-tokens", "24", "--warmup", "0", "--threads", THREADS]
    result = CliRunner().invoke(app, ["tune", "--method", "suffix", *common, "--out", str(tmp_path / "tune")])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "tune" / "tune.json").read_text())
    frame = pd.read_csv(tmp_path / "tune" / "candidates.csv")
    assert list(frame.candidate) == ["paper default", "max_spec_tokens=4"]
    assert (frame.tau >= 1).all() and (frame.round_ms > 0).all() and np.isfinite(frame.speedup).all()
    chosen = frame.loc[frame.tokens_per_s.idxmax()]
    assert record["opts"] == ([] if chosen.candidate == "paper default" else ["max_spec_tokens=4"])
    assert record["measured_speedup"] > 0 and record["machine"] == f"float32-cpu-{THREADS}t"
    assert (tmp_path / "cache" / "tune" / "smollm2-135m" / f"suffix-float32-cpu-{THREADS}t.json").exists()
    # a bar per candidate, a point per live one, with its interval
    assert set(drawn["candidates"]["legend"]) == {"predicted", "measured (95% interval)"}
    assert 2 in drawn["candidates"]["points"] and (tmp_path / "tune" / "candidates.png").exists()
    # live: the chosen budget and the paper's, or the paper's alone when it is the choice (1 prompt of 24 tokens
    # can leave the two within noise of each other: a clean-clone CI run once chose the paper's)
    live = frame.dropna(subset=["measured_speedup"])
    assert len(live) == (2 if record["opts"] else 1) and (live.measured_low <= live.measured_speedup).all()
    assert (live.measured_speedup <= live.measured_high).all()
    # the live runs were interleaved with a baseline of their own, prompt by prompt
    pairing = {json.loads((tmp_path / "tune" / f / "run.json").read_text())["pairing"]["id"]
               for f in ("live_baseline", "live_0", *(["live_1"] if record["opts"] else []))}
    assert len(pairing) == 1

    result = CliRunner().invoke(app, ["run", "--method", "suffix", "--tuned", *common, "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert info["tuned_from"].endswith(f"suffix-float32-cpu-{THREADS}t.json")
    assert info["settings"]["options"]["max_spec_tokens"] == (4 if record["opts"] else 64)


# ---------------------------------------------------------------------------------------------- per load level
def test_vllm_table_maps_each_level_up_to_the_next_in_vllms_own_form():
    """`num_speculative_tokens_per_batch_size`: inclusive ranges from 1, non-overlapping, sorted, as vLLM's
    validator requires (vllm/v1/spec_decode/dynamic/utils.py; the engine test has vLLM build its lookup from one)."""
    table = budgets.schedule({1: 8, 2: 4, 4: 4, 8: 2})
    assert table == [[1, 1, 8], [2, 3, 4], [4, 7, 4], [8, 8, 2]]
    assert budgets.schedule({4: 3}) == [[1, 4, 3]]  # the first range starts at 1 whatever the first level
    assert budgets.schedule({2: 5, 8: 3}) == [[1, 7, 5], [8, 8, 3]]
    # vLLM's expansion rule, written out here: a batch size takes the K of the range it falls in, past the last one
    # the last K
    dense = {b: next(k for s, e, k in reversed(table) if s <= b) for b in range(1, 13)}
    assert [dense[b] for b in (1, 2, 3, 4, 7, 8, 12)] == [8, 4, 4, 4, 4, 2, 2]


def test_a_batch_prices_every_sequence_of_the_round():
    """At batch 4 a round costs the curve of 4 sequences verifying together, the batch's step time and the draft
    scaled; it emits 4 sequences' tokens."""
    one = predict(("k=4",), [walk([1, 0] * 20, 4, 2.0)], CPU_LIKE, base_ms=12.0, reverifies=False)
    four = predict(("k=4",), [walk([1, 0] * 20, 4, 2.0)], CPU_LIKE, base_ms=12.0, reverifies=False, batch=4,
                   draft_scale=3.0)
    assert four.draft_ms == pytest.approx(6.0) and four.round_ms == pytest.approx(6.0 + 16.25 + 2.0)
    assert four.tokens_per_s == pytest.approx(4 * 2 / 24.25 * 1e3) and four.speedup == pytest.approx(2 * 12 / 24.25)
    assert one.tokens_per_s == pytest.approx(2 / 20.25 * 1e3)


def _register(tmp_path, record: dict, name: str) -> None:
    folder = tmp_path / "tune" / "smollm2-135m"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(record))


def test_run_tuned_applies_the_level_of_its_load(tmp_path, monkeypatch):
    """Our engine: the choice of the largest tuned level not above the run's batch size (else the smallest
    level's). vLLM with a table: the longest K's options (the engine's cap) and the table."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    levels = [{"load": 2, "opts": ["num_pred_tokens=4"]}, {"load": 8, "opts": ["num_pred_tokens=2"]}]
    _register(tmp_path, {"opts": ["num_pred_tokens=6"], "levels": levels}, "pld-float32-cpu-2t.json")
    got = {b: budgets.tuned_opts("smollm2-135m", "pld", "float32-cpu-2t", b).opts for b in (1, 2, 4, 8, 16)}
    assert got == {1: ["num_pred_tokens=4"], 2: ["num_pred_tokens=4"], 4: ["num_pred_tokens=4"],
                   8: ["num_pred_tokens=2"], 16: ["num_pred_tokens=2"]}
    table = [[1, 1, 6], [2, 2, 2]]
    _register(tmp_path, {"opts": ["num_pred_tokens=6"], "levels": levels, "engine": "vllm", "schedule": table},
              "pld-vllm-float32-cpu-2t.json")
    tuned = budgets.tuned_opts("smollm2-135m", "pld", "vllm-float32-cpu-2t", 2)
    assert tuned.opts == ["num_pred_tokens=6"] and tuned.schedule == table


def test_run_engine_vllm_tuned_passes_the_table_to_the_engine(tmp_path, monkeypatch):
    """The plan of `run --engine vllm --tuned` asks vLLM for the tuned K as num_speculative_tokens and the
    table as num_speculative_tokens_per_batch_size (what run.json's settings record)."""
    import sys

    from specbench_cli.inputs import RunConfig
    from specbench_cli.planning import plan

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    table = [[1, 1, 6], [2, 3, 4]]
    _register(tmp_path, {"opts": ["num_pred_tokens=6"], "engine": "vllm", "schedule": table,
                         "levels": [{"load": 1, "opts": ["num_pred_tokens=6"]}, {"load": 2, "opts": ["num_pred_tokens=4"]}]},
              "pld-vllm-float32-cpu-2t.json")
    monkeypatch.setattr("torch.get_num_threads", lambda: 2)
    config = RunConfig(method="pld", model="smollm2-135m", dataset="spec-bench", limit=1, dtype="float32",
                       engine="vllm", engine_python=sys.executable, tuned=True, concurrency=2, out=tmp_path / "r")
    planned = plan(config, {})
    assert planned.engine.speculative_config["num_speculative_tokens"] == 6
    assert planned.engine.speculative_config["num_speculative_tokens_per_batch_size"] == table
    assert planned.settings()["speculative_config"]["num_speculative_tokens_per_batch_size"] == table
    assert any("K per batch size" in note for note in planned.notes)


def test_run_drafts_eagle3s_cpu_budget_where_no_opt_or_paper_budget_says_otherwise(tmp_path):
    """On a CPU our engine drafts the recorded CPU budget when no --opt sets an eagle3 option; an --opt keeps the
    paper's other values, --paper-budget (cpu_budget False) all of them; vLLM is asked for the paper's mapping."""
    import sys

    import torch

    from specbench_cli.inputs import RunConfig
    from specbench_cli.planning import plan
    from specbench_methods.eagle3 import Eagle3

    def planned(**more):
        return plan(RunConfig(method="eagle3", model="smollm2-135m", dataset="spec-bench", limit=1, dtype="float32",
                              device="cpu", out=tmp_path / "r", **more), {})

    def budget(p) -> tuple[int, int, int]:
        return p.options.depth, p.options.top_k, p.options.total_token

    paper = (Eagle3.Options.depth, Eagle3.Options.top_k, Eagle3.Options.total_token)
    cpu = budgets.CPU_BUDGETS["eagle3"]
    chosen = planned(cpu_budget=True)
    assert budget(chosen) == budget(plan(RunConfig(method="eagle3", device="cpu", opts=list(cpu.opts)), {}))
    assert budget(chosen) != paper and chosen.cpu_budget_from == cpu.record
    assert any("--paper-budget" in note for note in chosen.notes)
    assert budget(planned(cpu_budget=True, opts=["depth=4"])) == (4, *paper[1:])
    assert budget(planned(cpu_budget=False)) == paper and not planned(cpu_budget=False).cpu_budget_from
    in_vllm = planned(cpu_budget=True, engine="vllm", engine_python=sys.executable)
    assert not in_vllm.cpu_budget_from and in_vllm.engine.speculative_config["num_speculative_tokens"] == 9
    assert budgets.cpu_budget("eagle3", torch.device("cuda"), True, []) is None
    assert budgets.cpu_budget("suffix", torch.device("cpu"), True, []) is None


def test_every_cpu_budget_cites_a_committed_record_that_measured_it():
    """A CPU budget is a measured choice: its record exists and ran our engine at exactly that budget."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for method, cpu in budgets.CPU_BUDGETS.items():
        record = json.loads((root / cpu.record).read_text())
        row = next(r for r in record["methods"] if r["method"] == method)
        ran = {key: str(value) for key, value in row["specbench"]["options"].items()}
        assert ran == dict(opt.split("=") for opt in cpu.opts), cpu.record


@pytest.mark.parametrize("args, says", [
    (["--method", "suffix", "--concurrency", "1,2"], "--concurrency is not --engine specbench's"),
    (["--method", "suffix", "--engine", "vllm", "--batch-size", "1,2"], "--batch-size is not --engine vllm's"),
    (["--method", "dart", "--engine", "vllm", "--concurrency", "1,2"], "tune --engine vllm tunes a draft length"),
    (["--method", "hf-generate", "--batch-size", "1,2"], "tune has no budgets for 'hf-generate'"),
    (["--method", "pld", "--batch-size", "1,8", "--limit", "4"], "--batch-size 8 is more than the 4 prompt(s)"),
    (["--method", "pld", "--batch-size", "1,0"], "--batch-size"),
])
def test_tune_per_level_bad_input_is_one_line(tmp_path, monkeypatch, args, says):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    result = CliRunner().invoke(app, ["tune", *args, "--out", str(tmp_path / "t")])
    assert result.exit_code == 2 and says in result.output, result.output
    assert not (tmp_path / "t").exists()


@pytest.mark.slow
@needs_embedded
def test_tune_per_batch_size_chooses_per_level_and_run_tuned_applies_it(tmp_path, monkeypatch):
    """A small real tune of pld at batch sizes 1 and 2: per level the verify cost at that size, a live baseline
    before and after, the paper budget and the chosen one live; each level's choice, vLLM's table (pld's budget
    is a draft length vLLM takes as it is); then `run --tuned --batch-size 2` applies level 2's choice."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(budgets.GRIDS, "pld", [("num_pred_tokens=2",)])
    monkeypatch.setattr(tuning, "COST_ROWS", (1, 2, 4, 8, 12))
    common = ["--limit", "2", "--max-new-tokens", "16", "--warmup", "0", "--threads", THREADS]
    result = CliRunner().invoke(app, ["tune", "--method", "pld", "--batch-size", "1,2", *common,
                                      "--out", str(tmp_path / "tune")])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert record["load"] == "batch_size" and [level["load"] for level in record["levels"]] == [1, 2]
    for level in record["levels"]:
        assert level["opts"] in ([], ["num_pred_tokens=2"]) and level["k"] == (10 if not level["opts"] else 2)
        assert level["measured_low"] <= level["measured_speedup"] <= level["measured_high"]
        assert level["baseline_before_tok_s"] > 0 and level["baseline_after_tok_s"] > 0 and level["draft_scale"] > 0
        for run in ("baseline", "paper", "baseline-after"):
            info = json.loads((tmp_path / "tune" / f"b{level['load']}" / run / "run.json").read_text())
            assert info["status"] == "complete" and info["settings"].get("batch_size", 1) == level["load"]
    assert record["schedule"] == [[1, 1, record["levels"][0]["k"]], [2, 2, record["levels"][1]["k"]]]
    frame = pd.read_csv(tmp_path / "tune" / "candidates.csv")
    assert sorted(set(frame["load"])) == [1, 2] and len(frame) == 4
    assert (tmp_path / "cache" / "tune" / f"costs-smollm2-135m-float32-cpu-{THREADS}t-b2-r{tuning.COSTS_REVISION}.json").exists()

    result = CliRunner().invoke(app, ["run", "--method", "pld", "--tuned", "--batch-size", "2", *common,
                                      "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert info["settings"]["options"]["num_pred_tokens"] == record["levels"][1]["k"]


@needs_embedded
def test_a_run_on_a_shared_engine_must_be_the_run_it_was_started_for(tmp_path, monkeypatch):
    """`VllmJob.on`: a run may use an engine the caller started (a tune's engine serves every level) only if that
    engine was launched with this run's own engine arguments; otherwise one line, before anything is decoded."""
    import sys

    from rich.console import Console

    from specbench_cli.engines.vllm import VllmJob, Worker, launch
    from specbench_cli.inputs import RunConfig
    from specbench_cli.planning import plan

    def planned(level: int, opts: list[str]):
        return plan(RunConfig(method="pld", model="smollm2-135m", dataset="spec-bench", limit=1, dtype="float32",
                              engine="vllm", engine_python=sys.executable, concurrency=level, opts=opts,
                              out=tmp_path / f"c{level}"), {})

    k10, k2 = planned(1, []), planned(2, ["num_pred_tokens=2"])
    worker = Worker(launch(k10, {}), tmp_path / "engine.log")  # never started: the check comes first
    other = VllmJob(k2, Console()).on(worker)
    other.begin()
    with pytest.raises(RuntimeError, match="other settings"):
        other.prepare()
    same = VllmJob(planned(2, []), Console()).on(worker)  # another level, the same engine arguments
    same.begin()
    same.prepare()
    assert same.engine.__enter__() is worker and worker.process is None  # not started by the job either
