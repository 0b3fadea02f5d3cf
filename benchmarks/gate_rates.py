"""The regression gate's false-alarm and detection rates on real runs of this machine, not a noise model.

A "night" is one `specbench run` of a method list (interleaved, `--repeat` passes), as a nightly job records it.
Normal nights run the engine as it is; slowed nights run it with an environment that makes it slower for real
(default SPECBENCH_DECODER_LAYERS=0: the decoder layers run as PyTorch's modules instead of one C++ call, the
issue's own slowed-engine case). The nights alternate kinds so that the machine's drift falls on both.
Then every ordered pair of nights is gated as `report --compare` gates it (`analysis.gate.compare`, in-process):
- normal against normal (A/A): a "regression" verdict there is a false alarm;
- slowed against a normal reference: a "regression" verdict on tokens/s is a detection.
Each verdict (pass, regression, inconclusive) is counted per measure (tokens/s, speedup) and method. Pairs share
nights, so they are not independent: the record gives the nights behind them. Clock: the runs' own (perf_counter
on a CPU). Writes a record (command, commit, machine, date, counts) with --record; --tally-only gates the
finished nights already under --out without running more.

    python benchmarks/gate_rates.py --nights 8 --slowed 4 --out /tmp/gate-rates \\
        --record benchmarks/results/gate/real-nights-cpu.json
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.record import write_record  # noqa: E402
from specbench_cli.analysis import gate, intervals  # noqa: E402
from specbench_cli.analysis.results import Results, load  # noqa: E402
from specbench_cli.folders import is_complete  # noqa: E402

import torch  # noqa: E402


def schedule(normal: int, slowed: int) -> list[str]:
    """Night kinds in run order, the slowed ones spread evenly among the normal ones."""
    kinds = ["normal"] * normal
    for i in range(slowed):
        kinds.insert(round((i + 1) * (normal + slowed) / (slowed + 1)) - 1, "slowed")
    return kinds


def run_night(folder: Path, slow_env: dict[str, str] | None, a: argparse.Namespace) -> None:
    """One night's list into `folder`, which must not exist yet (`--tally-only` gates the finished nights)."""
    env = {**os.environ, **(slow_env or {})}
    cmd = [sys.executable, "-m", "specbench_cli", "run", "--method", a.methods, "--dataset", a.dataset,
           "--limit", str(a.limit), "--max-new-tokens", str(a.max_new_tokens), "--repeat", str(a.repeat),
           "--threads", str(a.threads), "--dtype", a.dtype, "--out", str(folder)]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def tally(pairs: list[tuple[Results, Results]], threshold: float) -> dict:
    """Verdict counts per measure and method over `pairs` (reference, current), and each pair's ratios. Only the
    gate's speed rows count: a slowed engine may round differently, and A/A nights of one engine have equal
    outputs."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    ratios: dict[str, list[float]] = collections.defaultdict(list)
    for ref, cur in pairs:
        for row in gate.compare(cur, ref, threshold).rows:
            name = f"{row['measure']} {row['method']}"
            counts[name][row["verdict"]] += 1
            ratios[name].append(round(float(row["now / reference"]), 4))
    return {name: {"verdicts": dict(counts[name]), "pairs": sum(counts[name].values()), "ratios": ratios[name]}
            for name in sorted(counts)}


def rate(night: Results) -> float:
    """The night's baseline tokens/s (mean over its prompts and passes)."""
    group = next(g for g in night.groups if g.method == "baseline")
    return float(intervals.rates(group.prompts).rate.mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nights", type=int, default=8, help="normal nights")
    ap.add_argument("--slowed", type=int, default=4, help="slowed nights")
    ap.add_argument("--slow-env", default="SPECBENCH_DECODER_LAYERS=0", help="KEY=VALUE[,KEY=VALUE] of a slowed night")
    ap.add_argument("--methods", default="baseline,suffix")
    ap.add_argument("--dataset", default="spec-bench")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-regression", type=float, default=5.0, help="the gate's threshold, percent")
    ap.add_argument("--out", type=Path, default=Path("results/gate-rates"))
    ap.add_argument("--record", type=Path, default=None, help="write the record here (JSON)")
    ap.add_argument("--tally-only", action="store_true", help="run nothing: gate the nights already under --out")
    a = ap.parse_args()
    slow_env = dict(kv.split("=", 1) for kv in a.slow_env.split(","))
    nights = {"normal": [], "slowed": []}
    for i, kind in enumerate(schedule(a.nights, a.slowed)):
        folder = a.out / f"night-{i:02d}-{kind}"
        if a.tally_only:
            if all(is_complete(folder / m) for m in a.methods.split(",")):  # a finished night
                nights[kind].append(folder)
            continue
        print(f"night {i} ({kind}) -> {folder}", flush=True)
        run_night(folder, slow_env if kind == "slowed" else None, a)
        nights[kind].append(folder)
    loaded = {kind: [load([f]) for f in folders] for kind, folders in nights.items()}  # each night read once
    aa = list(itertools.permutations(loaded["normal"], 2))
    slowed = list(itertools.product(loaded["normal"], loaded["slowed"]))
    rates = {kind: [round(rate(night), 3) for night in runs] for kind, runs in loaded.items()}
    result = {"a/a (normal against normal)": tally(aa, a.max_regression),
              "slowed against normal": tally(slowed, a.max_regression)}
    for what, rows in result.items():
        for name, row in rows.items():
            print(f"{what}: {name}: {row['verdicts']} of {row['pairs']} ordered pairs", flush=True)
    print(f"baseline tokens/s per night: {rates}")
    if a.record:
        write_record(a.record, "report --compare verdicts over every ordered pair of real nights (benchmarks/gate_rates.py)",
                     "perf_counter (the runs' own decode_ms)", torch.device("cpu"),
                     settings={k: getattr(a, k) for k in ("slow_env", "methods", "dataset", "limit", "max_new_tokens",
                                                          "repeat", "threads", "dtype", "max_regression")},
                     nights_gated={kind: [f.name for f in folders] for kind, folders in nights.items()},
                     baseline_tokens_per_s=rates, verdicts=result)
        print(f"record: {a.record}")


if __name__ == "__main__":
    main()
