"""`specbench tune --engine vllm --concurrency 1,2,4,8`: the draft length for each number of requests in flight,
measured in vLLM, written as vLLM's own table.

vLLM takes a draft length per batch size from its user (`num_speculative_tokens_per_batch_size`,
vllm/config/speculative.py in 0.32) and has no way to find one. Inside vLLM a verify of n tokens cannot be timed
apart from the engine's step, so here the cost is measured whole: every candidate length K (`budgets.VLLM_GRIDS`,
the paper budget first) runs the tuning prompts at every level in an engine of its own, beside a baseline engine —
all started once, side by side, each serving every level with its caches emptied between runs (`VllmJob.on`), the
members' order rotated one place per level so that the machine's drift does not always fall on the same one. A
level's choice is the K with the most output tokens per second there (never 0, which vLLM's table allows: with
K = 0 from the table vLLM 0.32 still runs its speculative step, and ran at the speed of K = 10, not the
baseline's, on the embedded model at 1 in flight); the table maps each level's K from that level up to the
next (`budgets.schedule`). `run --engine vllm --tuned` then starts one engine with num_speculative_tokens = the
longest chosen K and the table, which vLLM's scheduler reads every step (vllm/v1/core/sched/scheduler.py:
K = table[requests scheduled]). The check (default) runs exactly that at every level, beside the baseline and
the paper budget again, and reports both speedups with their intervals.

Each run is an ordinary results folder (`<out>/c<N>/<member>`, `<out>/check/c<N>/<member>`), so `report <out>`
reads it as any concurrency sweep.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.table import Table as RichTable

from specbench_cli import budgets
from specbench_cli.commands.tune import pricing as tuning
from specbench_cli.analysis import intervals
from specbench_cli.engines.vllm import Launch, VllmJob, Worker, launch
from specbench_cli.core.errors import UsageError
from specbench_cli.folders import is_complete
from specbench_cli.inputs import Plan, RunConfig
from specbench_cli.planning import checkpoint_weights, plan
from specbench_cli.records import RUN_TABLES, read_table
from specbench_cli.run_folder import RunFolder, record
from specbench_cli.commands.train.train import command_line


NO_PER_STEP_K = "vllm/v1/spec_decode/suffix_decoding.py asserts num_speculative_tokens == its configured K"


@dataclass
class Member:
    """One engine of the tune: a method and budget, its plan at each level, the engine it runs on."""

    name: str
    opts: tuple[str, ...]
    plans: dict[int, Plan]
    k: int = 0  # vLLM's num_speculative_tokens at the first level (0: the baseline)
    workers: dict[int, Worker] = field(default_factory=dict)  # level -> the engine its run uses


@dataclass
class Measured:
    """A run at one level: its throughput (output tokens over its wall time) and speedup over the baseline of the
    same level, each with its unpaired 95 % interval (`intervals.throughput_interval`)."""

    rate: intervals.Interval
    speedup: intervals.Interval = field(default_factory=lambda: intervals.NOTHING)


def check(config: RunConfig, levels: list[int]) -> Path:
    """vLLM tunes a draft length: the methods whose budget there is one (`budgets.VLLM_GRIDS`); the folder of the
    largest level's baseline run."""
    if config.method not in budgets.VLLM_GRIDS:
        raise UsageError(f"tune --engine vllm tunes a draft length for {', '.join(budgets.VLLM_GRIDS)}; "
                         f"{config.method}'s budget in vLLM is not one")
    return config.out / f"c{levels[-1]}/baseline"


def tune(config, levels: list[int], console) -> budgets.TuneRecord:
    """Every candidate at every level, the choice per level, vLLM's table, and (`config.check`) the tuned engine
    run at every level beside the baseline and the paper budget (in the tune folder `tune_command` holds)."""
    run, out, method = config.run, config.run.out, config.method
    candidates = [(), *budgets.VLLM_GRIDS[method]]
    members = [_member(config, "baseline", (), levels, out)]
    for i, opts in enumerate(candidates):
        member = _member(config, f"candidate_{i}", opts, levels, out)
        if all(m.k != member.k for m in members):  # the paper budget may be one of the grid's lengths
            members.append(member)
    console.print(f"tune {method} in vLLM: K = {', '.join(str(m.k) for m in members[1:])} (the paper's first) at "
                  f"{', '.join(map(str, levels))} requests in flight", highlight=False)
    with ExitStack() as stack:
        engines: dict[str, Worker] = {}
        _start(members, engines, stack)
        measured = _measure(members, levels, console)
        paper, per_step = members[1], method in budgets.VLLM_PER_STEP_K
        # not K = 0: a table entry of 0 still runs vLLM's speculative step (measured: as slow as K 10, not the baseline)
        chosen = {n: max(members[1:], key=lambda m: measured[m.name, n].rate.value) for n in levels}
        table = budgets.schedule({n: chosen[n].k for n in levels}) if per_step else None
        cap = max(chosen.values(), key=lambda m: m.k) if per_step else chosen[levels[0]]
        base = members[0].plans[levels[0]]
        machine = budgets.machine_key(base.dtype, base.device, config.threads, False, "vllm")
        level_rows = [{"load": n, "k": chosen[n].k, "opts": list(chosen[n].opts),
                       "measured_speedup": measured[chosen[n].name, n].speedup.value,
                       "measured_low": measured[chosen[n].name, n].speedup.low,
                       "measured_high": measured[chosen[n].name, n].speedup.high,
                       "paper_k": paper.k, "paper_measured_speedup": measured[paper.name, n].speedup.value,
                       "baseline_tok_s": measured["baseline", n].rate.value} for n in levels]
        record_ = budgets.TuneRecord(
            run.model, method, machine, list(cap.opts), None, level_rows[0]["measured_speedup"], None,
            level_rows[0]["paper_measured_speedup"], str(out), command_line(),
            dt.datetime.now().isoformat(timespec="seconds"), _candidates(members, levels, measured),
            engine="vllm", load="concurrency", levels=level_rows, schedule=table,
            weights=checkpoint_weights(next(m for m in members if m.name != "baseline").plans[levels[0]]))
        registered = budgets.write_record(record_, out)
        console.print(_table(members, levels, measured, chosen, f"tune {method} in vLLM ({machine})"))
        console.print((f"chosen: num_speculative_tokens {cap.k}, num_speculative_tokens_per_batch_size {table}"
                       if per_step else
                       f"chosen: K {', '.join(f'{chosen[n].k} at {n}' for n in levels)} in flight, each a fixed "
                       f"num_speculative_tokens: vLLM's {method} proposer takes no K per step "
                       f"({NO_PER_STEP_K})")
                      + f"; `specbench run --engine vllm --method {method} --tuned` uses it ({registered})",
                      highlight=False, soft_wrap=True)
        if config.check:
            _check(config, levels, members[0], paper, record_, engines, stack, console)
    return record_


def _member(config, name: str, opts: tuple[str, ...], levels: list[int], out: Path, tuned: bool = False,
            root: str = "") -> Member:
    """A member's plans, one per level (`<out>/[root/]c<N>/<name>`), each resumed where it has a run.json."""
    run = config.run
    plans = {}
    for n in levels:
        folder = out / root / f"c{n}" / name
        plans[n] = plan(dataclasses.replace(run, method="baseline" if name == "baseline" else config.method,
                                            opts=list(opts), engine="vllm", concurrency=n, out=folder,
                                            resume=(folder / "run.json").exists(), tuned=tuned), dict(os.environ))
    spec = plans[levels[0]].engine.speculative_config
    return Member(name, opts, plans, 0 if spec is None else int(spec["num_speculative_tokens"]))


def _start(members: list[Member], engines: dict[str, Worker], stack: ExitStack) -> None:
    """An engine for every distinct launch among the members' unfinished runs (one per budget: it serves every
    level), stopped when the stack closes; `engines` keeps them by launch for later members. They start in two
    waves, each side by side: the first engine of each method, then the rest, which find their method's compiled
    graphs in vLLM's cache (started together, every one compiled the same graph again)."""
    waves: tuple[list[Worker], list[Worker]] = ([], [])
    methods: set[str] = set()
    for m in members:
        for n, run in m.plans.items():
            if is_complete(run.out):  # a resumed tune: nothing left to run there
                continue
            spec = launch(run, dict(os.environ))
            key = _launch_key(spec)
            if key not in engines:
                folder = run.out.parent.parent / "engines"
                folder.mkdir(parents=True, exist_ok=True)
                engines[key] = Worker(spec, folder / f"{m.name}-c{n}.log")
                stack.callback(engines[key].stop)
                waves[run.config.method in methods].append(engines[key])
                methods.add(run.config.method)
            m.workers[n] = engines[key]
    for wave in waves:
        for worker in wave:
            worker.launch()
        for worker in wave:
            worker.started()


def _launch_key(spec: Launch) -> str:
    """What tells engines apart: a run may use an engine started with its own arguments and environment."""
    return json.dumps([spec.engine_args, spec.env], sort_keys=True, default=str)


def _measure(members: list[Member], levels: list[int], console) -> dict[tuple[str, int], Measured]:
    """Each member at each level, in an order rotated one place per level; each run's throughput and speedup."""
    for j, n in enumerate(levels):
        for m in members[j % len(members):] + members[:j % len(members)]:
            _record(m.plans[n], m.workers.get(n), console)
    measured = {}
    for n in levels:
        base = _read(members[0].plans[n].out)
        for m in members:
            mine = _read(m.plans[n].out)
            measured[m.name, n] = Measured(intervals.throughput_interval(*mine), intervals.throughput_ratio_interval(
                mine[0], mine[1], base[0], base[1]))
    return measured


def _record(run: Plan, worker: Worker | None, console) -> None:
    """One run on a started engine (skipped when its folder is complete: a resumed tune)."""
    if is_complete(run.out):
        return
    folder, job = RunFolder(run.out, RUN_TABLES), VllmJob(run, console).on(worker)
    with folder.session(run.config.resume, lambda line: console.print(line, highlight=False)):
        record(folder, job, run.prompts, run.warmup, run.config.resume, console,
               f"{job.label} at {run.config.concurrency} in flight")


def _read(folder: Path) -> tuple[pd.DataFrame, float]:
    return read_table(folder, "prompts"), tuning.throughput(folder)


def _check(config, levels: list[int], baseline: Member, paper: Member, record_: budgets.TuneRecord,
           engines: dict[str, Worker], stack: ExitStack, console) -> None:
    """`run --engine vllm --tuned` at every level (the registered record's K and table; an engine already up
    serves a run whose launch is its own) beside the baseline and the paper budget again; speedups into the
    record."""
    out = config.run.out
    tuned = _member(config, "tuned", (), levels, out, tuned=True, root="check")
    again = [dataclasses.replace(m, plans={n: _replan(p, out / "check" / f"c{n}" / m.name) for n, p in m.plans.items()},
                                 workers={}) for m in (baseline, paper)]
    needed = {_launch_key(launch(p, dict(os.environ))) for m in (*again, tuned) for p in m.plans.values()}
    for key in [k for k in engines if k not in needed]:  # the other candidates' engines: their memory back first
        engines.pop(key).stop()
    members = [again[0], tuned, again[1]]
    _start(members, engines, stack)
    measured = _measure(members, levels, console)
    for row, n in zip(record_.levels, levels):
        for name, key in (("tuned", "check_tuned"), (paper.name, "check_paper")):
            s = measured[name, n].speedup
            row |= {f"{key}_speedup": s.value, f"{key}_low": s.low, f"{key}_high": s.high}
    budgets.write_record(record_, out)
    table = RichTable(title=f"check: `run --engine vllm --tuned` (K {record_.schedule or _fixed(record_)}) against the "
                            f"paper budget (K {paper.k}), each beside the same level's baseline", show_lines=False,
                      caption="× = throughput over the baseline's at that level, with its unpaired 95% interval")
    for col in ("in flight", "baseline tok/s", "paper ×", "tuned ×"):
        table.add_column(col, justify="right", no_wrap=True)
    for n in levels:
        table.add_row(str(n), f"{measured['baseline', n].rate.value:.1f}", measured[paper.name, n].speedup.text(),
                      measured["tuned", n].speedup.text())
    console.print(table)


def _replan(run: Plan, folder: Path) -> Plan:
    config = dataclasses.replace(run.config, out=folder, resume=(folder / "run.json").exists())
    return dataclasses.replace(run, config=config, out=folder)


def _candidates(members: list[Member], levels: list[int], measured: dict) -> list[dict]:
    return [{"candidate": budgets.label(m.opts), "k": m.k, "load": n, "tokens_per_s": measured[m.name, n].rate.value,
             "tokens_per_s_low": measured[m.name, n].rate.low, "tokens_per_s_high": measured[m.name, n].rate.high,
             "measured_speedup": measured[m.name, n].speedup.value, "measured_low": measured[m.name, n].speedup.low,
             "measured_high": measured[m.name, n].speedup.high}
            for m in members[1:] for n in levels]


def _fixed(record_: budgets.TuneRecord) -> str:
    return ", ".join(f"{row['k']} at {row['load']}" for row in record_.levels)


def _table(members: list[Member], levels: list[int], measured: dict, chosen: dict, title: str) -> RichTable:
    table = RichTable(title=title, show_lines=False,
                      caption="per level: throughput over the baseline's there (unpaired 95% interval); * = chosen "
                              "(the most tokens/s); the first K is the paper budget")
    table.add_column("K", justify="right", no_wrap=True, min_width=12)
    for n in levels:
        table.add_column(f"{n} in flight", justify="right", no_wrap=True)
    table.add_row("baseline", *(f"{measured['baseline', n].rate.value:.1f} tok/s" for n in levels))
    for m in members[1:]:
        table.add_row(str(m.k), *(("* " if chosen[n] is m else "") + measured[m.name, n].speedup.text()
                                  for n in levels))
    return table
