"""`specbench sweep CONFIG.toml`: a (model × dataset × method × option) grid as jobs with stable hashes.

    out = "results/nightly"            # every job writes <out>/<model>_<dataset>_<method>_<hash>
    models = ["smollm2-135m"]
    datasets = ["spec-bench"]
    methods = ["baseline", "suffix", "eagle3"]

    [run]                              # `specbench run` settings for every job (names as in run --help)
    limit = 12
    max_new_tokens = 128

    [options.eagle3]                   # --opt grid of one method: a list expands, a scalar is fixed
    depth = [4, 8]

A load in `[run]` may be a list too (`batch_size = [1, 2, 4, 8]`, or `concurrency` for an engine): every job
then runs at each level, and `specbench report <out>` shows throughput and speedup against it.

A job's hash covers everything that changes its records (model, dataset, method, options, run settings),
so the same grid always gives the same directories: re-running skips finished jobs and resumes unfinished
ones, and `--shard i/n` takes every n-th job from i, the same split on every machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from specbench_cli.core.errors import UsageError, unknown
from specbench_cli.datasets import dataset_slug
from specbench_cli.folders import is_complete
from specbench_cli.inputs import RunConfig

# `[run]` keys a sweep may set: RunConfig fields that are not chosen per job.
RUN_KEYS = tuple(f.name for f in dataclasses.fields(RunConfig)
                 if f.name not in ("method", "model", "dataset", "opts", "out", "resume", "shard", "results_root"))
LOAD_KEYS = ("batch_size", "concurrency")  # `[run]` keys whose list of levels expands the grid


@dataclass(frozen=True)
class Job:
    model: str
    dataset: str
    method: str
    options: tuple[tuple[str, object], ...]
    run: tuple[tuple[str, object], ...]

    @property
    def hash(self) -> str:
        payload = json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:10]

    def name(self) -> str:
        return f"{self.model}_{dataset_slug(self.dataset)}_{self.method}_{self.hash}"

    def config(self, root: Path) -> RunConfig:
        out = root / self.name()
        return RunConfig(method=self.method, model=self.model, dataset=self.dataset, out=out,
                         resume=(out / "run.json").exists(), opts=[f"{k}={v}" for k, v in self.options],
                         **dict(self.run))


@dataclass
class Sweep:
    out: Path
    jobs: list[Job]

    def shard(self, spec: str | None, env: dict[str, str] | None = None) -> list[Job]:
        """Jobs i, i+n, i+2n ... of shard `i/n` (default: the Slurm array task's, else all)."""
        from specbench_cli.datasets import parse_shard

        i, n = parse_shard(spec, env or {})
        return self.jobs[i::n]


def load(path: Path) -> Sweep:
    if not path.exists():
        raise UsageError(f"sweep config not found: {path}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{path}: not valid TOML ({err})") from None
    for key in ("models", "datasets", "methods"):
        if not isinstance(data.get(key), list) or not data[key]:
            raise UsageError(f"{path}: '{key}' must be a non-empty list")
    known = {"out", "models", "datasets", "methods", "run", "options", "expect"}  # expect: for report --expect
    for key in data:
        if key not in known:
            raise unknown(f"key in {path}", key, known)
    from specbench_cli.registry import METHODS

    for method in data["methods"]:
        if method not in METHODS:
            raise unknown("method", method, METHODS)
    run = data.get("run", {})
    for key, value in run.items():
        if key not in RUN_KEYS:
            raise unknown(f"[run] setting in {path}", key, RUN_KEYS)
        for one in value if key in LOAD_KEYS and isinstance(value, list) else [value]:
            _check_type(path, key, one)
    grids = data.get("options", {})
    for method in grids:
        if method not in data["methods"]:
            raise UsageError(f"{path}: [options.{method}] names a method that is not in 'methods'")
    loads = expand({k: v for k, v in run.items() if k in LOAD_KEYS})
    jobs = [Job(model, dataset, method, options, tuple(sorted({**run, **dict(levels)}.items())))
            for model in data["models"] for dataset in data["datasets"] for method in data["methods"]
            for options in expand(grids.get(method, {})) for levels in loads]
    return Sweep(Path(data.get("out", f"results/{path.stem}")), jobs)


def _check_type(path: Path, key: str, value: object) -> None:
    """A `[run]` value must have its RunConfig field's type (TOML gives int, float, bool, str and lists)."""
    declared = {f.name: str(f.type) for f in dataclasses.fields(RunConfig)}[key]  # e.g. "int | None"
    base = declared.split("|")[0].split("[")[0].strip()
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    ok, what = {"int": (lambda v: number(v) and isinstance(v, int), "an integer"), "float": (number, "a number"),
                "bool": (lambda v: isinstance(v, bool), "true or false"), "str": (lambda v: isinstance(v, str), "a string"),
                "Path": (lambda v: isinstance(v, str), "a path string"),
                "list": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings")}[base]
    if not ok(value):
        raise UsageError(f"{path}: [run] {key} = {value!r} must be {what}")


def expand(grid: dict[str, object]) -> list[tuple[tuple[str, object], ...]]:
    """Every combination of the grid's list values (scalars are one-value lists), in key order."""
    keys = sorted(grid)
    values = [v if isinstance(v, list) else [v] for v in (grid[k] for k in keys)]
    return [tuple(zip(keys, combo)) for combo in itertools.product(*values)]


def status(job: Job, root: Path) -> str:
    """done (complete run.json), partial (started, resumable) or todo."""
    folder = root / job.name()
    if not (folder / "run.json").exists():
        return "todo"
    return "done" if is_complete(folder) else "partial"


def slurm_script(config: Path, sweep: Sweep, shards: int, concurrency: int, hours: float, cpus: int) -> str:
    """A job-array script: one array task per shard, at most `concurrency` at once, one GPU each."""
    h, m = int(hours), int(round((hours - int(hours)) * 60))
    return f"""#!/bin/bash
# specbench sweep {config}: {len(sweep.jobs)} jobs in {shards} array tasks (written by `specbench sweep --slurm`)
#SBATCH --job-name=specbench-{config.stem}
#SBATCH --array=0-{shards - 1}%{concurrency}
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task={cpus}
#SBATCH --time={h:02d}:{m:02d}:00
#SBATCH --output={sweep.out}/slurm/%A_%a.out
set -euo pipefail
cd {Path.cwd()}
specbench sweep {config} --shard "${{SLURM_ARRAY_TASK_ID}}/{shards}"
"""


def run_shard(config: str, shard: str | None, console=None, env: dict[str, str] | None = None) -> tuple[int, int]:
    """Run one shard in this process (the CLI, an array task or a submitit job): every job is checked
    before the first one runs; finished jobs are skipped. Returns (jobs run, jobs skipped)."""
    from rich.console import Console

    from specbench_cli.planning import plan
    from specbench_cli.run_folder import record_run

    sweep = load(Path(config))
    todo = [job for job in sweep.shard(shard, env) if status(job, sweep.out) != "done"]
    skipped = len(sweep.shard(shard, env)) - len(todo)
    plans = [plan(job.config(sweep.out), {}) for job in todo]  # {}: a job's prompts are never Slurm-sharded
    for checked in plans:
        record_run(checked, console or Console())
    return len(plans), skipped


def submit(config: Path, sweep: Sweep, shards: int, concurrency: int, hours: float, cpus: int) -> str:
    """Submit the array through submitit (when installed): one task per shard, one GPU each."""
    try:
        import submitit
    except ImportError:
        raise UsageError("--submit needs submitit (pip install submitit); or drop --submit and sbatch the script") from None
    executor = submitit.AutoExecutor(folder=str(sweep.out / "slurm"))
    executor.update_parameters(name=f"specbench-{config.stem}", slurm_array_parallelism=concurrency,
                               timeout_min=int(hours * 60), gpus_per_node=1, cpus_per_task=cpus)
    jobs = executor.map_array(run_shard, [str(config.resolve())] * shards, [f"{i}/{shards}" for i in range(shards)])
    return jobs[0].job_id.split("_")[0]
