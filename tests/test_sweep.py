"""Sweep expansion, stable hashes, sharding, skipping finished jobs, the Slurm script and bad configs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specbench_cli.commands import sweep
from specbench_cli.cli import app
from specbench_cli.core.errors import UsageError

GRID = """
out = "{out}"
models = ["smollm2-135m"]
datasets = ["spec-bench", "mt-bench"]
methods = ["baseline", "suffix", "eagle3"]

[run]
limit = 4
max_new_tokens = 64

[options.eagle3]
depth = [4, 8]
top_k = 4
"""


@pytest.fixture()
def config(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(GRID.format(out=tmp_path / "out"))
    return path


def test_expansion_is_the_full_grid_with_stable_hashes(config):
    jobs = sweep.load(config).jobs
    assert len(jobs) == 2 * (1 + 1 + 2)  # datasets × (baseline, suffix, eagle3 × depth {4, 8})
    eagle = [j for j in jobs if j.method == "eagle3" and j.dataset == "spec-bench"]
    assert [dict(j.options) for j in eagle] == [{"depth": 4, "top_k": 4}, {"depth": 8, "top_k": 4}]
    assert len({j.hash for j in jobs}) == len(jobs)
    assert [j.name() for j in sweep.load(config).jobs] == [j.name() for j in jobs]  # same file, same names
    config.write_text(config.read_text().replace("max_new_tokens = 64", "max_new_tokens = 65"))
    assert not {j.hash for j in sweep.load(config).jobs} & {j.hash for j in jobs}  # a setting changes every hash
    run = jobs[0].config(sweep.load(config).out)
    assert run.limit == 4 and run.max_new_tokens == 64 and not run.resume


def test_shards_partition_the_jobs_deterministically(config):
    grid = sweep.load(config)
    parts = [grid.shard(f"{i}/3") for i in range(3)]
    assert sorted(j.hash for p in parts for j in p) == sorted(j.hash for j in grid.jobs)
    assert parts[1] == grid.jobs[1::3]
    assert grid.shard(None, {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "3"}) == parts[2]


def test_finished_jobs_are_skipped_and_unfinished_resume(config):
    grid = sweep.load(config)
    for job, state in zip(grid.jobs, ["complete", "running"]):
        (grid.out / job.name()).mkdir(parents=True)
        (grid.out / job.name() / "run.json").write_text(json.dumps({"status": state}))
    assert [sweep.status(j, grid.out) for j in grid.jobs[:3]] == ["done", "partial", "todo"]
    assert grid.jobs[1].config(grid.out).resume and not grid.jobs[2].config(grid.out).resume
    ran, skipped = sweep.run_shard(str(config), "0/8")  # shard 0/8 holds only the finished first job
    assert (ran, skipped) == (0, 1)


def test_slurm_script(config):
    grid = sweep.load(config)
    text = sweep.slurm_script(config, grid, shards=3, concurrency=2, hours=1.5, cpus=6)
    assert "#SBATCH --array=0-2%2" in text and "#SBATCH --gres=gpu:1" in text and "--time=01:30:00" in text
    assert f'specbench sweep {config} --shard "${{SLURM_ARRAY_TASK_ID}}/3"' in text
    result = CliRunner().invoke(app, ["sweep", str(config), "--slurm", "--shards", "3"])
    assert result.exit_code == 0 and (grid.out / "sweep.sbatch").read_text().count("#SBATCH") == 6


def test_a_load_list_runs_every_job_at_each_level(config):
    config.write_text(config.read_text().replace("limit = 4", "limit = 4\nbatch_size = [1, 4]"))
    jobs = sweep.load(config).jobs
    assert len(jobs) == 2 * 2 * (1 + 1 + 2)
    sizes = sorted(dict(j.run)["batch_size"] for j in jobs if j.method == "suffix" and j.dataset == "mt-bench")
    assert sizes == [1, 4] and len({j.hash for j in jobs}) == len(jobs)
    assert jobs[0].config(config.parent).batch_size in (1, 4)


@pytest.mark.parametrize("edit,message", [
    (("limit = 4", "limit = 4\nbatch_size = [1, 2.5]"), "[run] batch_size = 2.5 must be an integer"),
    (("methods = [", "method = ["), "'methods' must be a non-empty list"),
    (("limit = 4", "limt = 4"), "did you mean 'limit'"),
    (("[options.eagle3]", "[options.dflash]"), "[options.dflash] names a method that is not in 'methods'"),
    (("out =", "out = = "), "not valid TOML"),
])
def test_bad_configs_are_one_line(config, edit, message):
    config.write_text(config.read_text().replace(*edit))
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        sweep.load(config)
    result = CliRunner().invoke(app, ["sweep", str(config), "--list"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
