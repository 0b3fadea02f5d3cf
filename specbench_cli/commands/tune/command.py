"""What `specbench tune` does around a tune: its input checked in one line each before a model or an engine
starts, the tune folder held for the whole tune (`folders.claim`: one writer; an existing folder is continued),
then one of its three kinds — one budget (`tune.py`), a budget per batch size of our engine (`tune_batch.py`), a
draft length per concurrency in vLLM (`tune_vllm.py`)."""

from __future__ import annotations

import dataclasses
import os

from rich.console import Console

from specbench_cli.core.errors import UsageError
from specbench_cli.inputs import RunConfig, at_least, check_run, parse_levels, use_threads


def execute(config: RunConfig, batch_size: str, concurrency: str, check: bool, console: Console) -> None:
    from specbench_cli.commands.tune import pricing as tuning

    at_least("--threads", config.threads, 1)
    at_least("--limit", config.limit, 1)
    tuning.check_method(config.method)
    batches, engines = parse_levels(batch_size, "--batch-size"), parse_levels(concurrency, "--concurrency")
    vllm = config.engine == "vllm"
    if engines != [1] and not vllm:
        raise UsageError("--concurrency is for --engine vllm (requests in flight); our engine tunes per --batch-size")
    if batches != [1] and vllm:
        raise UsageError("--batch-size is our engine's; with --engine vllm tune per --concurrency")
    if vllm and config.method not in tuning.VLLM_GRIDS:
        raise UsageError(f"tune --engine vllm tunes a draft length for {', '.join(tuning.VLLM_GRIDS)}; "
                         f"{config.method}'s budget in vLLM is not one")
    levels = sorted(set(engines if vllm else batches))
    folder = config.out / ("baseline" if levels == [1] and not vllm else f"c{levels[-1]}/baseline" if vllm
                           else f"b{levels[-1]}/baseline")
    top = {"concurrency": levels[-1]} if vllm else {"batch_size": levels[-1]}
    check_run(dataclasses.replace(config, method="baseline", out=folder, resume=(folder / "run.json").exists(), **top),
              dict(os.environ))  # the largest level's: its batch must fit the selection
    use_threads(config.threads)
    import torch

    from specbench_cli.folders import claim
    from specbench_cli.commands.tune.budget import TuneConfig

    tune = TuneConfig(config.method, config, config.threads or torch.get_num_threads(), check)
    with claim(config.out, resume=config.out.exists(), note=lambda line: console.print(line, highlight=False)):
        if vllm:
            from specbench_cli.commands.tune.vllm import execute as tune_levels
        elif levels != [1]:
            from specbench_cli.commands.tune.batch import execute as tune_levels
        else:
            from specbench_cli.commands.tune.budget import execute as tune_one

            tune_one(tune, console)
            return
        tune_levels(tune, levels, console)
