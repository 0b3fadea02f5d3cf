"""`report --export spec-bench DIR`: Spec-Bench's answer files, read back with the arithmetic of its
`evaluation/speed.py` (hemingkx/Spec-Bench): a method's prompt rate is Σ new_tokens / Σ wall_time over its turns,
the speedup the ratio of the mean rates, the mean accepted tokens the mean of every step's accept length."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench_cli.cli import app
from tests.fake_runs import Turn, baseline_turns, write_run


def answers(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def speed_py_rate(lines: list[dict]) -> float:
    """speed.py's tokens per second of a method's file: the mean over lines of Σ new_tokens / Σ wall_time."""
    rates = [sum(a["choices"][0]["new_tokens"]) / sum(a["choices"][0]["wall_time"]) for a in lines]
    return sum(rates) / len(rates)


def speed_py_accept(lines: list[dict]) -> float:
    steps = [n for a in lines for n in a["choices"][0]["accept_lengths"]]
    return sum(steps) / len(steps)


def test_each_method_becomes_an_answer_file_whose_speed_is_ours(tmp_path):
    turns = [Turn("81", "mt_bench", [3, 1, 0, 2], 40.0, category="writing"),
             Turn("81", "mt_bench", [1, 1], 20.0, category="writing", turn=1),
             Turn("241", "summarization", [4, 4, 0], 25.0, category="summarization")]
    write_run(tmp_path / "runs" / "eagle3", "eagle3", turns)
    write_run(tmp_path / "runs" / "baseline", "baseline", baseline_turns(turns, 5.0))
    result = CliRunner().invoke(app, ["report", str(tmp_path / "runs"), "--out", str(tmp_path / "report"),
                                      "--no-plots", "--no-classify", "--export", "spec-bench", str(tmp_path / "x")])
    assert result.exit_code == 0, result.output
    files = {p.name: answers(p) for p in (tmp_path / "x" / "spec-bench").glob("*.jsonl")}
    assert set(files) == {"tiny-eagle3-float32-temperature-0.0.jsonl", "tiny-baseline-float32-temperature-0.0.jsonl"}
    mine = files["tiny-eagle3-float32-temperature-0.0.jsonl"]
    assert [(a["question_id"], a["category"]) for a in mine] == [(81, "writing"), (241, "summarization")]
    first = mine[0]["choices"][0]
    assert first["new_tokens"] == [10, 4] and first["decoding_steps"] == [4, 2]
    assert first["accept_lengths"] == [4, 2, 1, 3, 2, 2] and first["wall_time"] == pytest.approx([0.04, 0.02])
    overview = pd.read_csv(tmp_path / "report" / "overview.csv").set_index("method")
    rate, base = speed_py_rate(mine), speed_py_rate(files["tiny-baseline-float32-temperature-0.0.jsonl"])
    assert rate == pytest.approx(overview.loc["eagle3", "tokens/s"])
    assert rate / base == pytest.approx(overview.loc["eagle3", "speedup"])
    assert speed_py_accept(mine) == pytest.approx(overview.loc["eagle3", "τ"])


def test_specdec_bench_files_hold_its_acceptance_and_timing_and_a_consistent_profile(tmp_path):
    """Steps of 2, 2, 1, 3, 2, 2 | 2, 2 | 5, 5, 1 tokens: a histogram with a gap (no step of 4), the rates
    specdec_bench's _process_lengths gives it, a profile whose marginals sum to the per-step mean less one and never
    rise (also across the gap), and the per-request mean (specdec_bench's Average_AL) apart from the per-step one."""
    turns = [Turn("81", "writing", [1, 1, 0, 2, 1, 1], 40.0), Turn("81", "writing", [1, 1], 20.0, turn=1),
             Turn("241", "summarization", [4, 4, 0], 25.0)]
    write_run(tmp_path / "runs" / "eagle3", "eagle3", turns)
    write_run(tmp_path / "runs" / "baseline", "baseline", baseline_turns(turns, 5.0))
    result = CliRunner().invoke(app, ["report", str(tmp_path / "runs"), "--out", str(tmp_path / "report"),
                                      "--no-plots", "--no-classify", "--export", "specdec-bench", str(tmp_path / "x")])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "x" / "spec-bench" / "tiny-eagle3-float32-temperature-0.0"
    (acceptance,) = json.loads((folder / "acceptance_rate.json").read_text())
    assert acceptance["Acceptance_Length_Histogram"] == {"1": 2, "2": 6, "3": 1, "5": 2}
    joint = {int(k): v for k, v in acceptance["Joint_Acceptance_Rate"].items()}
    assert joint == pytest.approx({1: 1.0, 2: 9 / 11, 3: 3 / 11, 5: 2 / 11})
    conditional = {int(k): v for k, v in acceptance["Conditional_Acceptance_Rate"].items()}
    assert conditional == pytest.approx({1: 1.0, 2: 9 / 11, 3: 1 / 3, 5: 2 / 3})  # 5 over 3, the length seen before
    assert acceptance["Request_AL"] == {"81": {"0": 2.0, "1": 2.0}, "241": {"0": pytest.approx(11 / 3)}}
    per_request = (2.0 + 2.0 + 11 / 3) / 3
    assert acceptance["Average_AL"] == pytest.approx(per_request)
    profile = json.loads((folder / "speculation_profile.json").read_text())
    per_step = 27 / 11
    assert profile["mean_accept_length"] == pytest.approx(per_step, abs=1e-6)
    assert profile["mean_accept_length_per_request"] == pytest.approx(per_request, abs=1e-6)
    assert profile["marginal_accept_rates"] == pytest.approx([9 / 11, 3 / 11, 2 / 11, 2 / 11], abs=1e-6)  # >= 4: 2/11
    assert 1 + sum(profile["marginal_accept_rates"]) == pytest.approx(per_step, abs=1e-5)
    assert profile["validation"]["mean_consistency"]["passed"] and profile["validation"]["marginal_monotonicity"]["passed"]
    assert profile["num_speculative_tokens"] == 4  # the fake rounds draft 4 deep
    overview = pd.read_csv(tmp_path / "report" / "overview.csv").set_index("method")
    assert overview.loc["eagle3", "τ"] == pytest.approx(per_step) and overview.loc["eagle3", "τ turn-mean"] == pytest.approx(per_request)
    (timing,) = json.loads((folder / "timing.json").read_text())
    assert float(timing["TTFT Time"]["mean"]) == pytest.approx(0.005)  # the fake turns' 5 ms
    assert not (tmp_path / "x" / "spec-bench" / "tiny-baseline-float32-temperature-0.0" / "speculation_profile.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--export", "specbench", "x"], "unknown export format 'specbench'"),
])
def test_bad_exports_are_one_line(tmp_path, args, message):
    write_run(tmp_path / "runs" / "baseline", "baseline", baseline_turns([Turn("1", "qa", [0], 5.0)], 5.0))
    result = CliRunner().invoke(app, ["report", str(tmp_path / "runs"), "--out", str(tmp_path / "r"), *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "r").exists()


def test_runs_without_the_records_an_export_needs_are_named(tmp_path):
    import pyarrow.parquet as pq

    folder = write_run(tmp_path / "runs" / "baseline", "baseline", baseline_turns([Turn("1", "qa", [0], 5.0)], 5.0))
    for part in (folder / "prompts.parquet").glob("part-*.parquet"):  # a run written before answer texts were kept
        pq.write_table(pq.read_table(part).drop(["output_text"]), part)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "runs"), "--out", str(tmp_path / "r"),
                                      "--export", "spec-bench", str(tmp_path / "x")])
    assert result.exit_code == 2 and "has no output_text" in result.output, result.output
    assert not (tmp_path / "x").exists()


def test_runs_of_two_datasets_export_into_a_folder_each(tmp_path):
    from specbench_cli.analysis import exports
    from specbench_cli.analysis.results import load

    for dataset in ("spec-bench", "mt-bench"):
        write_run(tmp_path / "runs" / dataset, "suffix", [Turn("1", "writing", [2, 0], 5.0)], dataset=dataset)
    written = exports.export(load([tmp_path / "runs"]), "spec-bench", tmp_path / "x")
    assert sorted(p.relative_to(tmp_path / "x").as_posix() for p in written) == [
        "mt-bench/tiny-suffix-float32-temperature-0.0.jsonl", "spec-bench/tiny-suffix-float32-temperature-0.0.jsonl"]


class Words:
    """A tokenizer of whitespace-separated words, with a BOS first where `bos` (as Llama's adds one)."""

    def __init__(self, bos: bool) -> None:
        self.bos = bos

    def __call__(self, text: str):
        return type("Encoded", (), {"input_ids": [0] * self.bos + text.split()})


def test_what_speed_py_reads_for_a_baseline_is_computed_with_its_arithmetic():
    """speed.py counts a baseline's tokens as len(tokenizer(answer).input_ids) - 1 per turn: our decode tokens
    where the tokenizer adds a BOS and the text round-trips, one token short per turn where it adds none, and 0 for
    an answer that is only the stop token."""
    from specbench_cli.analysis.exports import speed_py_rates

    prompts = pd.DataFrame({"prompt_id": ["a", "a", "b"], "repeat": [0, 0, 0], "turn": [0, 1, 0],
                            "output_text": ["w w w w", "w w", ""], "decode_tokens": [4, 2, 1],
                            "decode_ms": [1000.0, 1000.0, 500.0]})
    # a: 6 tokens in 2 s; b: 1 token in 0.5 s (its answer is only the stop token: speed.py reads 0)
    assert speed_py_rates(prompts, Words(bos=True)) == pytest.approx(((6 / 2 + 0 / 0.5) / 2, (3 + 2) / 2))
    assert speed_py_rates(prompts, Words(bos=False))[0] == pytest.approx((4 / 2 - 1 / 0.5) / 2)


def test_the_spec_bench_export_says_when_it_cannot_compute_speed_py_s_baseline(tmp_path):
    write_run(tmp_path / "runs" / "baseline", "baseline", baseline_turns([Turn("81", "qa", [1, 1], 20.0)], 5.0))
    result = CliRunner().invoke(app, ["report", str(tmp_path / "runs"), "--out", str(tmp_path / "report"),
                                      "--no-plots", "--no-classify", "--export", "spec-bench", str(tmp_path / "x")])
    assert result.exit_code == 0 and "baseline: cannot compute what speed.py reads for this baseline" in result.output
