"""CUDA-event phase sums vs host wall time per round, for every run under a folder (they must agree within a
few % when no phase hides a host sync): prints median and p90 of (wall - sum of phases) / wall per run."""

from __future__ import annotations

import sys
from pathlib import Path

from specbench_cli.core.timing import PHASES
from specbench_cli.records import read_table

for rounds_dir in sorted(p.parent for p in Path(sys.argv[1]).rglob("run.json")):
    try:
        rounds = read_table(rounds_dir, "rounds")
    except Exception:  # noqa: BLE001 - a folder without rounds (a report) is skipped
        continue
    phases = sum(rounds.get(f"{p}_ms", 0.0).fillna(0.0) for p in PHASES)
    gap = (rounds.wall_ms - phases) / rounds.wall_ms
    print(f"{rounds_dir.parent.name}/{rounds_dir.name}: rounds {len(rounds)}, wall {rounds.wall_ms.median():.3f} ms, "
          f"phases {phases.median():.3f} ms, host gap median {gap.median():.1%}, p90 {gap.quantile(0.9):.1%}")
