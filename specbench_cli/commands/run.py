"""What `specbench run` does around a run: every --concurrency or --batch-size level checked before the first
one starts and before torch loads (`inputs.check_run`), then each planned (`planning.plan`) and recorded
(`run_folder.record_run`)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from rich.console import Console

from specbench_cli.core.errors import UsageError
from specbench_cli.inputs import RunConfig, use_threads


def run_levels(config: RunConfig, concurrency: str, batch_size: str, threads: int | None, console: Console) -> None:
    """Each --concurrency or --batch-size level as its own run; every level's input is checked before the first
    one starts."""
    from specbench_cli.inputs import check_run, level_configs, parse_levels

    if "," in config.method or config.repeat != 1:
        from specbench_cli.commands.interleave import run_list

        run_list(config, batch_size, concurrency, threads, console)
        return
    engines, batches = parse_levels(concurrency, "--concurrency"), parse_levels(batch_size, "--batch-size")
    if len(engines) > 1 and len(batches) > 1:
        raise UsageError("sweep --concurrency or --batch-size, not both at once")
    if len(batches) > 1:
        configs = level_configs(dataclasses.replace(config, concurrency=engines[0]), batches, "batch_size")
    else:
        configs = level_configs(dataclasses.replace(config, batch_size=batches[0]), engines, "concurrency")
    for each in configs[1:]:
        check_run(each, dict(os.environ))
    for each in configs:
        run_one(each, threads, console)


def run_one(config: RunConfig, threads: int | None, console: Console) -> Path:
    """Plan and record a run (bad input is answered before torch is imported)."""
    from specbench_cli.inputs import at_least, check_run

    at_least("--threads", threads, 1)
    chosen = check_run(config, dict(os.environ))
    from specbench_cli.planning import plan
    from specbench_cli.run_folder import record_run

    use_threads(threads)
    return record_run(plan(config, dict(os.environ), chosen), console)
