"""Throughput and speedup against load: the tables and figure of DART's Tables 6-7 (baseline tokens/s, each
method's tokens/s and speedup per load level), with τ and the latency percentiles beside them.

A load is either the number of requests an engine keeps in flight (`run --engine vllm --concurrency`) or the
number of sequences our engine decodes together (`run --batch-size`), one run per level; each has its own
tables and figure. A method's speedup at a level is against the same engine's baseline at the same level,
model, dataset and hardware (`Results.baseline_for`: both loads are part of the experiment).

Throughput here is what a server's is: output tokens of all requests / wall seconds of the run. Engine and
batch runs record it (run.json `throughput`); for our engine at batch 1, which decodes one request at a time,
it is Σ new tokens / Σ (TTFT + decode time) over the prompts, the same quantity with nothing overlapping.
"""

from __future__ import annotations

import pandas as pd

from specbench_cli.analysis import intervals
from specbench_cli.analysis.metrics import tau
from specbench_cli.analysis.results import BEFORE, Results, RunGroup, method_label, read_info
from specbench_cli.analysis.tables import Table

# Each load: what one unit of it is (the figure's axis says so).
LOADS = {"concurrency": "requests in flight", "batch_size": "sequences per forward"}
PERCENTILES = (50, 90, 99)


def level(group: RunGroup, load: str) -> int:
    return int(group.info["settings"].get(load, BEFORE[load]))


def throughput(group: RunGroup) -> float:
    """Output tokens per wall second of the run (see the module docstring); runs of the same settings (a tune's
    run and its check's) pool their recorded tokens and seconds."""
    if len(group.dirs) == 1:
        return run_throughput(group.info, group.prompts)
    spans = [read_info(d).get("throughput", {}) for d in group.dirs]
    if all("seconds" in s and "output_tokens" in s for s in spans) and sum(s["seconds"] for s in spans) > 0:
        return sum(s["output_tokens"] for s in spans) / sum(s["seconds"] for s in spans)
    return run_throughput({}, group.prompts)


def run_throughput(info: dict, prompts: pd.DataFrame) -> float:
    """One run's output tokens per wall second: run.json's (`info`; engine and batch runs record it), else Σ new
    tokens / Σ (TTFT + decode) over its prompts (our engine at batch 1: one request at a time, the times add up)."""
    recorded = info.get("throughput", {}).get("output_tokens_per_s")
    if recorded is not None:
        return float(recorded)
    seconds = (prompts.ttft_ms.sum() + prompts.decode_ms.sum()) / 1e3
    return prompts.new_tokens.sum() / seconds if seconds > 0 else float("nan")


def with_intervals(results: Results, group: RunGroup) -> tuple[intervals.Interval, intervals.Interval]:
    """A run's throughput and its speedup over the same level's baseline (NOTHING without one), each with its
    unpaired 95 % interval (`intervals.throughput_interval`)."""
    rate = intervals.throughput_interval(group.prompts, throughput(group))
    base = results.baseline_for(group)
    if base is None:
        return rate, intervals.NOTHING
    return rate, intervals.throughput_ratio_interval(group.prompts, rate.value, base.prompts, throughput(base))


def _series(results: Results, load: str) -> dict[tuple, dict[int, RunGroup]]:
    """Groups of one method (options included), model, dataset and engine, keyed by their level of `load`
    (runs measured at the other load's level 1 only)."""
    series: dict[tuple, dict[int, RunGroup]] = {}
    for g in results.groups:
        if any(level(g, other) > 1 for other in LOADS if other != load):
            continue
        s = g.info["settings"]
        key = (s["model"], s["dataset"], method_label(s))
        series.setdefault(key, {})[level(g, load)] = g
    return series


def swept(results: Results, load: str) -> bool:
    """Whether any run was measured above level 1 of `load` (else its tables say nothing new)."""
    return any(level(g, load) > 1 for g in results.groups)


def throughput_table(results: Results, load: str) -> Table:
    """DART Tables 6-7's form: per model, dataset, engine and level, the baseline's tokens/s, then each method's
    tokens/s, speedup over that baseline and τ."""
    rows: dict[tuple, dict] = {}
    for (model, dataset, label), levels in _series(results, load).items():
        for n, g in sorted(levels.items()):
            engine = g.info["settings"].get("engine", BEFORE["engine"])
            row = rows.setdefault((model, dataset, engine, n), {"model": model, "dataset": dataset, "engine": engine,
                                                                 load: n, "baseline tok/s": float("nan")})
            rate, speedup = with_intervals(results, g)
            if g.method == "baseline":
                row["baseline tok/s"], row["baseline 95% CI"] = rate.value, rate.range(1)
                continue
            name = label.split(":", 1)[-1]
            row[f"{name} tok/s"], row[f"{name} tok/s 95% CI"] = rate.value, rate.range(1)
            row[f"{name} ×"], row[f"{name} × 95% CI"] = speedup.value, speedup.range()
            row[f"{name} τ"] = tau(g.prompts.decode_tokens.sum(), g.prompts.rounds.sum())
    frame = pd.DataFrame(sorted(rows.values(), key=lambda r: (r["model"], r["dataset"], r["engine"], r[load])))
    return Table(f"throughput_vs_{load}", f"Throughput and speedup against {load.replace('_', ' ')} (output tokens/s "
                 "of all requests over the run's wall time)", frame,
                 "× = the method's throughput / the same engine's baseline at the same level (— where that run is "
                 "missing); τ = mean acceptance length, bonus included. 95% CI, unpaired (each level is a run of its "
                 "own): the bootstrap spread over prompts of Σ tokens / Σ request time, relative to its value, "
                 "applied to the run's throughput (for ×, each run's drawn on its own; expanded percentile)")


def latency_table(results: Results, load: str) -> Table:
    """Per run: requests/s, TTFT and TPOT percentiles (TPOT of a request = decode time / decode tokens)."""
    rows = []
    for (model, dataset, label), levels in _series(results, load).items():
        for n, g in sorted(levels.items()):
            p = g.prompts
            tpot = (p.decode_ms / p.decode_tokens).where(p.decode_tokens > 0)
            wall = g.info.get("throughput", {}).get("seconds")
            row = {"model": model, "dataset": dataset, "method": label, load: n,
                   "requests/s": len(p) / wall if wall and len(g.dirs) == 1 else float("nan")}
            row |= {f"TTFT p{q} ms": p.ttft_ms.quantile(q / 100) for q in PERCENTILES}
            row |= {f"TPOT p{q} ms": tpot.quantile(q / 100) for q in PERCENTILES}
            rows.append(row)
    return Table(f"latency_vs_{load}", f"Latency against {load.replace('_', ' ')}: time to first token and time per "
                 "output token, percentiles over requests", pd.DataFrame(rows),
                 "requests/s: runs that record their throughput (engine and batch runs: requests finished / wall "
                 "seconds of the run)")


def tables(results: Results) -> list[Table]:
    return [t for load in LOADS if swept(results, load) for t in (throughput_table(results, load),
                                                                   latency_table(results, load))]


def context(results: Results) -> str:
    """What every line of the figure shares (model · dataset · dtype), when they share it."""
    keys = {(g.info["settings"]["model"], g.info["settings"]["dataset"], g.info["settings"].get("dtype", "?"))
            for g in results.groups}
    return " · ".join(next(iter(keys))) if len(keys) == 1 else ""


def figure_series(results: Results, load: str) -> dict[str, pd.DataFrame]:
    """Per line of the figure (model · dataset · method when several), its levels with throughput and speedup (each
    with its 95 % bounds, `_low`/`_high`) and τ."""
    series = _series(results, load)
    many = len({k[:2] for k in series}) > 1
    out = {}
    for (model, dataset, label), levels in series.items():
        rows = []
        for n, g in sorted(levels.items()):
            rate, speedup = with_intervals(results, g)
            rows.append({load: n, "throughput": rate.value, "throughput_low": rate.low, "throughput_high": rate.high,
                         "speedup": speedup.value, "speedup_low": speedup.low, "speedup_high": speedup.high,
                         "tau": tau(g.prompts.decode_tokens.sum(), g.prompts.rounds.sum())})
        out[f"{label} · {model} · {dataset}" if many else label] = pd.DataFrame(rows)
    return out
