"""`report --expect`: published values against hand-made runs whose τ and per-position rates are known, and
the parity suite's own files (each a sweep whose jobs must carry the labels its expectations name)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbench_cli.cli import app
from specbench_cli.analysis.parity import load_expectations
from specbench_cli.analysis.results import method_label
from specbench_cli.commands.sweep import load as load_sweep
from tests.fake_runs import Turn, write_run

PARITY = Path(__file__).parent.parent / "benchmarks" / "parity"
# Prompt A: 4 rounds accepting 3 (τ 4); prompt B: 4 rounds accepting 1 (τ 2). Token-weighted τ = 24 / 8 = 3;
# turn-mean τ = 3 too. Drafts of depth 3: α1 = 1, α2 = 0.5, α3 = 0.5.
TURNS = [Turn("A", "qa", [3] * 4, 100.0, depth=3), Turn("B", "qa", [1] * 4, 100.0, depth=3)]


def expect_file(tmp_path: Path, value: float, positions: str = "[]", method: str = "eagle3", rtol: float = 0.05) -> Path:
    path = tmp_path / "expect.toml"
    path.write_text(f'[[expect]]\nsource = "hand-made"\nmodel = "tiny"\ndataset = "spec-bench"\nmethod = "{method}"\n'
                    f'temperature = 0.0\nmetric = "tau"\nvalue = {value}\nrtol = {rtol}\npositions = {positions}\n')
    return path


@pytest.fixture()
def runs(tmp_path):
    return write_run(tmp_path / "runs" / "eagle3", "eagle3", TURNS).parent


def report(runs: Path, expect: Path, out: Path):
    return CliRunner().invoke(app, ["report", str(runs), "--out", str(out), "--no-classify", "--no-plots",
                                    "--expect", str(expect)])


def test_values_within_tolerance_pass_and_are_tabled(runs, tmp_path):
    result = report(runs, expect_file(tmp_path, 2.9, "[0.99, 0.5, 0.45]"), tmp_path / "rep")
    assert result.exit_code == 0, result.output
    assert "all 1 published values reproduced" in result.output
    assert "| ok |" in (tmp_path / "rep" / "parity.md").read_text()


@pytest.mark.parametrize("value,positions,method,message", [
    (2.5, "[]", "eagle3", "tau 3.000, published 2.500 (20.0% off; tolerance 5%)"),
    (3.0, "[1.0, 0.6]", "eagle3", "α2 0.5000 below published 0.6000 - 5%"),
    (3.0, "[]", "eagle3[depth=2]", "no run matches"),
])
def test_a_missed_or_missing_value_exits_1_naming_it(runs, tmp_path, value, positions, method, message):
    result = report(runs, expect_file(tmp_path, value, positions, method), tmp_path / "rep")
    assert result.exit_code == 1 and f"parity: tiny/spec-bench/{method}/t0: {message}" in result.output, result.output


def test_a_malformed_expect_file_is_one_line_before_anything_loads(runs, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[expect]]\nsource = "x"\nmodel = "tiny"\ndataset = "d"\nmethod = "m"\ntemperature = 0\n'
                   'metric = "speed"\nvalue = 2.0\nrtol = 0.05\n')
    result = report(runs, bad, tmp_path / "rep")
    assert result.exit_code == 2 and "metric 'speed' is not one of tau, tau_turn_mean" in result.output
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize("path", sorted(PARITY.glob("*.toml")), ids=lambda p: p.stem)
def test_each_parity_file_is_a_sweep_whose_jobs_its_expectations_name(path):
    """A typo in a method label or dataset would leave an expectation with no run: caught here, not on a GPU."""
    sweep = load_sweep(path)
    made = {(job.model, job.dataset, method_label({"method": job.method, "options": dict(job.options)}),
             float(dict(job.run).get("temperature", 0.0))) for job in sweep.jobs}
    for e in load_expectations(path):
        assert (e.model, e.dataset, e.method, e.temperature) in made, e
