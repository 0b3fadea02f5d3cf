"""A benchmark's record: one JSON object with what was measured, the command, commit, date, machine and clock, then
the numbers (docs/benchmarks.md, "Records"); and the numbers of one run that several records hold."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import torch

from specbench_cli.analysis import metrics
from specbench_cli.hardware import environment
from specbench_cli.records import read_table

ROOT = Path(__file__).resolve().parent.parent


def write_record(path: Path, what: str, clock: str, device: torch.device, **numbers) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    env = environment(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"what": what, "command": "python " + " ".join(sys.argv), "commit": commit,
                                "date": dt.date.today().isoformat(),
                                "machine": {k: env.get(k) for k in ("cpu", "torch_threads", "device")},
                                "clock": clock, **numbers}, indent=1))


def tau(prompts) -> float:
    """τ of a run's prompts table (`analysis.metrics.tau` over its sums)."""
    return float(metrics.tau(prompts.decode_tokens.sum(), prompts.rounds.sum()))


def phases_ms(folder: Path, columns: tuple[str, ...], digits: int = 2) -> dict[str, float]:
    """Our run's mean milliseconds a round in each of `columns` of rounds.parquet: where a method's time goes."""
    rounds = read_table(folder, "rounds")
    return {c: round(float(rounds[c].mean()), digits) for c in columns if c in rounds}
