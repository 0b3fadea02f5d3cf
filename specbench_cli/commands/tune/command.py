"""What `specbench tune` does around a tune: its input checked in one line each before a model or an engine
starts, the tune folder held for the whole tune (`folders.claim`: one writer; an existing folder is continued),
then the tune of the run's engine (its registry entry's `tune`): our engine's one budget (budget.py) or a budget
per batch size (batch.py), or vLLM's draft length per concurrency (vllm.py)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from rich.console import Console

from specbench_cli.inputs import RunConfig, at_least, check_load, check_run, parse_levels, use_threads
from specbench_cli.registry import engine_entry


def tune(config: RunConfig, batch_size: str, concurrency: str, check: bool, console: Console) -> None:
    """`config.out` None: results/tune_<model>_<method>[_<engine tag>]."""
    from specbench_cli import budgets

    at_least("--threads", config.threads, 1)
    at_least("--limit", config.limit, 1)
    budgets.check_method(config.method)
    given = {"batch_size": parse_levels(batch_size, "--batch-size"),
             "concurrency": parse_levels(concurrency, "--concurrency")}
    load = check_load(config.engine, {setting: levels != [1] for setting, levels in given.items()})
    entry = engine_entry(config.engine)
    levels = sorted(set(given[load]))
    if config.out is None:
        tag = f"_{entry.tag}" if entry.tag else ""
        config = dataclasses.replace(config, out=Path("results") / f"tune_{config.model}_{config.method}{tag}")
    tuner = entry.tuner()
    folder = tuner.check(config, levels)  # the engine's own checks; the largest level's baseline folder
    check_run(dataclasses.replace(config, method="baseline", out=folder, resume=(folder / "run.json").exists(),
                                  **{load: levels[-1]}), dict(os.environ))
    use_threads(config.threads)
    import torch

    from specbench_cli.folders import claim
    from specbench_cli.commands.tune.budget import TuneConfig

    settings = TuneConfig(config.method, config, config.threads or torch.get_num_threads(), check)
    with claim(config.out, resume=config.out.exists(), note=lambda line: console.print(line, highlight=False)):
        tuner.tune(settings, levels, console)
