"""EAGLE-3's draft phase alone, eager against compiled (`--compile`'s drafters), by the length of the context.

One process loads the target and two EAGLE-3 methods on the same drafter weights: the eager one and one whose
steps are compiled (`FeatureDrafter.compile`, planned for the longest context asked). At each context length both
draft over the same random cache and features (`Eagle3.switching_probes(..., draft_only=True)`), timed in turn,
rep by rep (perf_counter; on CUDA synchronised after each round). Reported: each one's median ms a round, and
compiled/eager as the median of the paired per-rep ratios with a bootstrap 95 % interval. A ratio below 1 means
compiled drafting is faster.

    python benchmarks/compiled_drafting.py --lengths 128,512,896 --reps 40 --dtype float32 \\
        --record benchmarks/results/drafting/compiled-eagle3-cpu-float32.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.record import write_record  # noqa: E402
from specbench_cli.engines.specbench import Runner  # noqa: E402
from specbench_cli.inputs import RunConfig  # noqa: E402
from specbench_cli.planning import loaded_target, plan  # noqa: E402


def timed(fn, device: torch.device) -> float:
    """fn's wall milliseconds (perf_counter), the device synchronised after it."""
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1e3


def ratio_interval(ratios: np.ndarray, rng: np.random.Generator, draws: int = 2000) -> tuple[float, float]:
    """Bootstrap 95 % interval of the median paired ratio."""
    medians = np.median(rng.choice(ratios, (draws, len(ratios))), axis=1)
    return float(np.quantile(medians, 0.025)), float(np.quantile(medians, 0.975))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", default="128,512,896", help="context lengths (cached tokens)")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", default=None, help="compile mode (default: inductor on a CPU, reduce-overhead on CUDA)")
    ap.add_argument("--opt", action="append", default=[], help="eagle3 option KEY=VALUE (e.g. depth=8)")
    ap.add_argument("--record", type=Path, default=None, help="write the record here (JSON)")
    ap.add_argument("--json", type=Path, default=None, help="write the numbers alone here (check.sh)")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    torch.set_num_threads(a.threads)
    out = Path(tempfile.mkdtemp()) / "run"
    config = RunConfig(model=a.model, method="eagle3", dtype=a.dtype, device=a.device, out=out, threads=a.threads,
                       opts=a.opt)
    checked = plan(config, dict(os.environ))
    runner = Runner(checked, loaded_target(checked, None))
    target, eager = runner.target, runner.method
    mode = a.mode or ("reduce-overhead" if target.device.type == "cuda" else "inductor")
    compiled = checked.method_cls(checked.options, runner.model, runner.drafters)
    room = compiled.switching_room() + 2
    target.plan(max(lengths) + room)
    for m in (eager, compiled):
        m.attach(target)
    t0 = time.perf_counter()
    seconds = compiled.compile(mode, max(lengths) + room, 1)
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    rows = []
    for L in lengths:
        probes = {}
        for name, m in (("eager", eager), ("compiled", compiled)):  # the same random inputs for both
            probes[name], _ = m.switching_probes(target, L, [1], torch.Generator().manual_seed(L), draft_only=True)
        for _ in range(a.warmup):
            for fn in probes.values():
                fn()
        ms = {name: [] for name in probes}
        for rep in range(a.reps):  # alternate which goes first
            for name in (("eager", "compiled") if rep % 2 == 0 else ("compiled", "eager")):
                ms[name].append(timed(probes[name], target.device))
        ratios = np.array(ms["compiled"]) / np.array(ms["eager"])
        low, high = ratio_interval(ratios, rng)
        row = {"context": L, "eager_ms": round(float(np.median(ms["eager"])), 3),
               "compiled_ms": round(float(np.median(ms["compiled"])), 3),
               "compiled_over_eager": round(float(np.median(ratios)), 3), "interval": [round(low, 3), round(high, 3)]}
        rows.append(row)
        print(row, flush=True)
    if compiled.late_compiles():
        print("late compiles:", compiled.late_compiles())
    if a.json:
        a.json.write_text(json.dumps({"mode": mode, "compile_seconds": seconds, "rounds": rows}, indent=1))
    if a.record:
        write_record(a.record, "EAGLE-3's draft phase alone, eager against compiled drafters, by context "
                     "(benchmarks/compiled_drafting.py)", "perf_counter", target.device,
                     model=a.model, dtype=a.dtype, mode=mode, options=vars(checked.options), reps=a.reps,
                     compile_seconds={k: round(v, 2) for k, v in seconds.items()}, compile_total_s=round(compile_s, 1),
                     late_compiles=compiled.late_compiles(), rounds=rows)


if __name__ == "__main__":
    main()
