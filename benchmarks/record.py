"""A benchmark's record: one JSON object with what was measured, the command, commit, date, machine and clock, then
the numbers (docs/benchmarks.md, "Records")."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import torch

from specbench_cli.hardware import environment

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
