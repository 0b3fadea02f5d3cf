"""`specbench profile`: where a method's time goes.

- `phases`: a short run of the method (after warm-up) whose rounds give mean/p50/p95 ms and the share of
  the round per phase (`specbench_cli.analysis.phases`), plus the FlashHead thesis' regrouping of them.
- `head`: microbenchmarks of a draft model's output head alone and of a whole draft step (one body
  forward + head), dense head vs FlashHead side by side (FlashHead thesis, Tables 4.1-4.4).

Timings on CUDA use a pair of CUDA events per repetition and one synchronize at the end; on CPU
`time.perf_counter_ns`. The clock's name goes into every table title.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import pandas as pd
import torch
from rich.console import Console

from specbench_cli.core.errors import UsageError
from specbench_cli.analysis.phases import flashhead_view, phase_table, split
from specbench_cli.records import read_table
from specbench_cli.analysis.tables import Table


def phases(run_dir: Path, console: Console) -> list[Path]:
    """Phase table, FlashHead view and stacked-bar plot of a finished run, written under run_dir/profile."""
    from specbench_cli.analysis import plots

    info = json.loads((run_dir / "run.json").read_text())
    rounds = read_table(run_dir, "rounds")
    if rounds.verify_ms.isna().all():
        raise UsageError(f"method {info['settings']['method']} runs its own loop: it has no per-phase times")
    folder = run_dir / "profile"
    method, clock = info["settings"]["method"], info["clock"]
    table = Table("phases", f"{method} · {info['settings']['model']}: ms per round by phase ({clock} clock, "
                  f"{len(split(rounds))} rounds)", phase_table(rounds), "host = round wall time minus the timed phases")
    view = Table("flashhead_view", f"{method}: FlashHead thesis profile (Tables 4.7/4.8)",
                 pd.DataFrame(list(flashhead_view(table.frame).items()), columns=["quantity", "value"]))
    for t in (table, view):
        console.print(t.rich())
    if method == "baseline":
        console.print(roofline(run_dir, info))
    written = [*table.write(folder), *view.write(folder)]
    table.frame.to_parquet(folder / "phases.parquet")
    written += plots.save(plots.phase_bars({method: rounds}, clock), folder, "phases")
    return [*written, folder / "phases.parquet"]


def roofline(run_dir: Path, info: dict) -> str:
    """The baseline's achieved bandwidth as gpt-fast reports it (weight bytes × decode tokens/s) and its share
    of this machine's measured DRAM read bandwidth (`hardware.read_bandwidth`, on the device the run used)."""
    from specbench_cli.hardware import read_bandwidth

    prompts = read_table(run_dir, "prompts")
    rate = prompts.decode_tokens.sum() / (prompts.decode_ms.sum() / 1e3)
    size = info.get("weight_bytes")
    if not size:
        return "roofline: run.json has no weight_bytes (a run recorded before it was kept)"
    device = torch.device(info["environment"].get("device", "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        return f"roofline: {size * rate / 1e9:.1f} GB/s achieved; the run's GPU is not here to measure its peak"
    peak = read_bandwidth(device)
    return (f"roofline: {rate:.1f} tok/s × {size / 1e6:.0f} MB of weights = {size * rate / 1e9:.1f} GB/s, "
            f"{size * rate / peak:.1%} of the measured read bandwidth {peak / 1e9:.0f} GB/s ({device}, "
            f"{torch.get_num_threads()} threads)")


# ---------------------------------------------------------------------------------------------- microbenchmarks
def repeat(fn: Callable[[], object], device: torch.device, reps: int, warmup: int) -> tuple[list[float], str]:
    """Milliseconds of each of `reps` calls after `warmup` calls, and the clock used."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        pairs = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) for s, e in pairs], "cuda-event"
    out = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out, "perf_counter_ns"


def stats(component: str, variant: str, ms: list[float]) -> dict:
    s = pd.Series(ms)
    return {"component": component, "variant": variant, "mean_ms": s.mean(), "p50_ms": s.quantile(0.5),
            "p95_ms": s.quantile(0.95), "per_s": 1e3 / s.mean(), "reps": len(ms)}


@torch.inference_mode()
def head_benchmark(method, target, prompt_ids: list[int], reps: int, warmup: int) -> tuple[pd.DataFrame, str]:
    """Dense head vs FlashHead of a `flashhead` method's draft model: the method's `head_probes` say what the head
    alone and a whole draft step are; each is timed `reps` times."""
    probes = method.head_probes(target, prompt_ids)
    rows, clock = [], "?"
    for component, which in (("head", 0), ("draft step", 1)):
        for variant, fns in probes.items():
            ms, clock = repeat(fns[which], target.device, reps, warmup)
            rows.append(stats(component, variant, ms))
    frame = pd.DataFrame(rows)
    dense = frame.set_index(["component", "variant"]).mean_ms
    frame["speedup_vs_dense"] = [dense[(c, "dense")] / m for c, m in zip(frame.component, frame.mean_ms)]
    return frame, clock


# What a method offers for each registry `profiles` measurement (test_registry checks every listed method has it).
PROBES = {"head": ("head_probes",), "switching": ("switching_probes", "switching_room")}


# ---------------------------------------------------------------------------------------------- switching
SWITCH_KV = (512, 1024, 2048, 4096, 8192, 16384)  # WhiFlash Table 4/12: base KV lengths
SWITCH_BACKLOG = (1, 64, 128, 512, 1024)  # and backlog tokens


@torch.inference_mode()
def switching_sweep(method, target, kv_lens, backlogs, reps: int, warmup: int, progress=None) -> tuple[pd.DataFrame, str]:
    """Catch-up cost of a switch as a share of a round at each base KV length (WhiFlash Table 4/12): the method's
    `switching_probes` (a routed method's, handed on by its EAGLE-3) say what a round and a catch-up are; this
    times them. Base lengths past the target's context (with room for a tree and the largest backlog) are skipped."""
    most = max(backlogs)
    limit = getattr(target.model.config, "max_position_embeddings", None) or (max(kv_lens) + most + 1)
    gen = torch.Generator().manual_seed(0)
    rows, clock = [], "?"
    for L in [k for k in kv_lens if k + most + method.switching_room() < limit]:
        one_round, catch_ups = method.switching_probes(target, L, list(backlogs), gen)
        round_ms, clock = repeat(one_round, target.device, reps, warmup)
        mean_round = float(pd.Series(round_ms).mean())
        for B, catch_up in catch_ups.items():
            ms, clock = repeat(catch_up, target.device, reps, warmup)
            mean = float(pd.Series(ms).mean())
            rows.append({"kv_len": L, "backlog": B, "catchup_ms": mean, "round_ms": mean_round,
                         "catchup_pct_of_round": 100 * mean / mean_round})
            if progress:
                progress()
    return pd.DataFrame(rows), clock


def component(config, reps: int, warmup_reps: int, what: str, kv_lens: list[int], backlogs: list[int],
              console: Console) -> list[Path]:
    """`--component head` (dense vs FlashHead) or `--switching` (WhiFlash catch-up cost) on the loaded method: a
    table (terminal, .md/.csv/.tex), the Parquet frame and a figure in the results folder, which it claims."""
    import os

    from specbench_cli.analysis import plots
    from specbench_cli.folders import claim
    from specbench_cli.planning import loaded_target, plan
    from specbench_cli.progress import progress_bar
    from specbench_cli.engines.specbench import Runner

    checked = plan(config, dict(os.environ))
    with claim(checked.out, resume=False, note=console.print):
        runner = Runner(checked, loaded_target(checked, None, config.device == "split"))
        header = f"({{clock}} clock, {reps} reps after {warmup_reps} warm-up"
        if what == "head":
            ids = runner.model.encode_chat([{"role": "user", "content": checked.prompts[0].turns[0]}])
            frame, clock = head_benchmark(runner.method, runner.target, ids, reps, warmup_reps)
            title = f"flashhead · {config.model}: dense head vs FlashHead {header}; FlashHead thesis Tables 4.1-4.4)"
            figure = plots.head_bars
        else:
            with progress_bar(console) as bar:
                task = bar.add_task("switching sweep", total=len(kv_lens) * len(backlogs), stats="")
                frame, clock = switching_sweep(runner.method, runner.target, kv_lens, backlogs, reps, warmup_reps,
                                               lambda: bar.update(task, advance=1))
            title = f"{config.method} · {config.model}: catch-up cost of a switch {header}; WhiFlash Table 4/12)"
            figure = plots.switching
        table = Table(what, title.format(clock=clock), frame)
        console.print(table.rich())
        frame.to_parquet(checked.out / f"{what}.parquet")
        return [*table.write(checked.out), checked.out / f"{what}.parquet",
                *plots.save(figure(frame, clock), checked.out, what)]
