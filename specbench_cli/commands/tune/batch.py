"""`specbench tune --batch-size 1,2,4,8`: the draft budget for each batch size of our engine, chosen from the
verify cost measured at that batch size.

A batch of B sequences verifies B drafts in one forward, so the rows a round costs grow with B times the draft,
and the budget that pays at batch 1 stops paying as B grows (DART, Tables 5-7; vLLM's per-batch-size table
exists for this). For each level B the prediction of `tuning.predict` is made with what B changes:

- c_B(n): a verify of B sequences of n rows each against one of B single rows, measured on this machine's
  target (`tuning.measure_costs` on a B-slot target model; cached per batch size);
- the round's fixed time: the live baseline at B, its rounds with all B sequences busy (`wall` per batch round);
- the draft: the replay's time per round (batch 1) scaled by how the paper budget's draft time per round grew
  from its replay to its live run at B (a network drafter drafts B sequences in one forward per step, a host
  drafter one after another);
- τ: the replay's, which a batch does not change (each sequence's output is its batch-1 output, core/engine.py).

Then, at each level, the chosen budget runs live (the paper budget always does) between a baseline before and one
after — our engine runs one batch size at a time, so the two baselines bracket the drift, and both are reported;
each speedup is over their mean throughput, with an unpaired 95 % interval. The choices are written per level
(`run --tuned --batch-size B` applies the largest tuned level not above B) and, where every chosen budget is a
draft length vLLM can take, as vLLM's `num_speculative_tokens_per_batch_size` table.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from dataclasses import asdict
from pathlib import Path

import pandas as pd
from rich.table import Table as RichTable

from specbench_cli import budgets
from specbench_cli.commands.tune import pricing as tuning
from specbench_cli.analysis import intervals
from specbench_cli.core.attention import attends_by_matmul
from specbench_cli.core.errors import UsageError
from specbench_cli.core.target import TargetModel
from specbench_cli.folders import is_complete
from specbench_cli.inputs import Plan, RunConfig
from specbench_cli.loading import load_model
from specbench_cli.planning import drafter_ref, method_weights, plan
from specbench_cli.records import read_table
from specbench_cli.registry import method_class
from specbench_cli.run_folder import record_run
from specbench_cli.commands.train.train import command_line
from specbench_cli.commands.tune.budget import TuneConfig, replay_walks
from specbench_cli.commands.tune.budget import tune_one


def check(config: RunConfig, levels: list[int]) -> Path:
    """Our engine tunes every method with a grid (`budgets.check_method`, already checked): the folder of the
    largest level's baseline run (a single level is one budget, budget.py's layout)."""
    return config.out / ("baseline" if levels == [1] else f"b{levels[-1]}/baseline")


def tune(config: TuneConfig, levels: list[int], console) -> budgets.TuneRecord:
    """Replays, then per size: its cost curve, the live runs, the choice (in the tune folder command.py holds); a
    single level is one budget (budget.py)."""
    if levels == [1]:
        return tune_one(config, console)
    run, out, method = config.run, config.run.out, config.method
    first = _plan(config, "baseline", (), 1, out / "baseline")
    model = load_model(first.spec, first.device, first.dtype)
    machine = budgets.machine_key(first.dtype, first.device, config.threads, first.batch_invariant)
    reverifies = first.batch_invariant and not attends_by_matmul(first.device, first.dtype)
    replays = replay_walks(config, first, model, console)
    rows, frames = [], []
    for n in levels:
        costs = _costs(config, model, first, machine, n, console)
        folder = out / f"b{n}"
        before, paper_run = (_live(config, name, opts, n, folder, model, console)
                             for name, opts in (("baseline", ()), ("paper", ())))
        base_step, paper_draft = round_ms(before, "wall", n), round_ms(paper_run, "draft", n)
        alone = [tuning.predict(c, w, costs, base_step, reverifies, batch=n) for c, w in replays]
        scale = paper_draft / alone[0].draft_ms if alone[0].draft_ms > 0 else 1.0
        predictions = [tuning.predict(c, w, costs, base_step, reverifies, batch=n, draft_scale=scale)
                       for c, w in replays]
        best = tuning.choose(predictions)
        chosen_run = paper_run if best is predictions[0] else _live(
            config, f"live_{predictions.index(best)}", best.opts, n, folder, model, console)
        after = _live(config, "baseline-after", (), n, folder, model, console)
        base = pd.concat([read_table(before, "prompts"), read_table(after, "prompts")])
        rate_before, rate_after = tuning.throughput(before), tuning.throughput(after)
        base_rate = (rate_before + rate_after) / 2
        paper_x, best_x = (intervals.throughput_ratio_interval(read_table(f, "prompts"), tuning.throughput(f), base, base_rate)
                           for f in (paper_run, chosen_run))
        rows.append({"load": n, "opts": list(best.opts), "k": vllm_k(config, best.opts, first),
                     "predicted_speedup": best.speedup, "measured_speedup": best_x.value, "measured_low": best_x.low,
                     "measured_high": best_x.high, "paper_predicted_speedup": predictions[0].speedup,
                     "paper_measured_speedup": paper_x.value, "paper_low": paper_x.low, "paper_high": paper_x.high,
                     "baseline_before_tok_s": rate_before, "baseline_after_tok_s": rate_after,
                     "draft_scale": scale, "base_step_ms": base_step, "candidate": best.candidate})
        frames.append(pd.DataFrame([asdict(p) for p in predictions]).drop(columns="opts").assign(load=n))
    ks = {row["load"]: row["k"] for row in rows}
    table = budgets.schedule(ks) if all(k is not None for k in ks.values()) else None
    record = budgets.TuneRecord(run.model, method, machine, rows[0]["opts"], rows[0]["predicted_speedup"],
                               rows[0]["measured_speedup"], rows[0]["paper_predicted_speedup"],
                               rows[0]["paper_measured_speedup"], str(out), command_line(),
                               dt.datetime.now().isoformat(timespec="seconds"),
                               pd.concat(frames).to_dict("records"), load="batch_size", levels=rows, schedule=table,
                               weights=method_weights(first, config.run))
    registered = budgets.write_record(record, out)
    console.print(_table(rows, f"tune {method} per batch size on {run.model} {machine}"))
    console.print(("vLLM's table (num_speculative_tokens_per_batch_size): " + str(table)) if table else
                  "no vLLM table: a chosen budget is a tree, which vLLM 0.32 does not draft", highlight=False)
    console.print(f"`specbench run --method {method} --tuned --batch-size B` uses the choice of the largest level "
                  f"not above B ({registered})", highlight=False, soft_wrap=True)
    return record


def _plan(config: TuneConfig, name: str, opts: tuple[str, ...], batch: int, folder: Path) -> Plan:
    method = "baseline" if name.startswith("baseline") else config.method
    return plan(dataclasses.replace(config.run, method=method, opts=list(opts), batch_size=batch, out=folder,
                                    resume=(folder / "run.json").exists()), dict(os.environ))


def _live(config: TuneConfig, name: str, opts: tuple[str, ...], batch: int, root: Path, model, console) -> Path:
    """A live run at batch `batch` into `<root>/<name>` (skipped when complete: a resumed tune)."""
    folder = root / name
    if not is_complete(folder):
        record_run(_plan(config, name, opts, batch, folder), console, model)
    return folder


def _costs(config: TuneConfig, model, first: Plan, machine: str, batch: int, console) -> tuning.Costs:
    """c_B(n): B sequences verifying n rows each, on a B-slot target like the batch runs' (cached)."""
    where = f"{config.run.model} {machine}, batch {batch}, perf_counter"
    key = f"{config.run.model}-{machine}" + (f"-b{batch}" if batch > 1 else "")
    costs, path = tuning.cached_costs(key, lambda: tuning.measure_costs(
        TargetModel(model.model, first.device, invariant=first.batch_invariant, slots=batch),
        model.model.config.vocab_size, reps=7 if batch == 1 else 3, where=where))  # B·n rows: fewer repeats
    console.print(f"verify cost at batch {batch} ({path}): t(1) {costs.t1_ms:.1f} ms, "
                  + ", ".join(f"c({n}) {c:.2f}" for n, c in costs.c.items() if n <= 33), highlight=False,
                  soft_wrap=True)
    return costs


def round_ms(folder: Path, phase: str, batch: int) -> float:
    """Mean time of `phase` ("wall", "draft") per round with all `batch` sequences busy (a batch round's rows
    share its times)."""
    rounds = read_table(folder, "rounds")
    full = rounds[rounds.batch_size == batch]
    if batch > 1:
        full = full.groupby(["repeat", "batch_round"]).first()
    return float(full[f"{phase}_ms"].mean())


def vllm_k(config: TuneConfig, opts: tuple[str, ...], first: Plan) -> int | None:
    """The draft length vLLM would take for this budget (its num_speculative_tokens), or None where vLLM would
    run other options than ours (a tree: vLLM 0.32 drafts one chain)."""
    from specbench_cli.engines.vllm_methods import engine_method
    from specbench_cli.options import parse_options

    cls = method_class(config.method)
    options = parse_options(cls, list(opts), [])
    try:
        drafters = {name: drafter_ref(cls, first.spec, {}, name) for name in cls.drafter_names}
        mapped = engine_method(config.method, options, {o.partition("=")[0] for o in opts}, drafters)
    except (UsageError, OSError, KeyError):
        return None
    if mapped.options != options or mapped.speculative_config is None:
        return None
    return int(mapped.speculative_config["num_speculative_tokens"])


def _table(rows: list[dict], title: str) -> RichTable:
    table = RichTable(title=title, show_lines=False,
                      caption="× = throughput over the mean of a baseline run before and one after (both shown), "
                              "unpaired 95% interval; pred. = the cost model's prediction at that batch size")
    for col in ("batch", "baseline before/after tok/s", "paper pred. ×", "paper ×", "chosen", "K", "pred. ×", "×"):
        table.add_column(col, justify="right" if col not in ("chosen",) else "left", overflow="fold")
    for r in rows:
        paper = intervals.Interval(r["paper_measured_speedup"], r["paper_low"], r["paper_high"], False, 0, 0)
        mine = intervals.Interval(r["measured_speedup"], r["measured_low"], r["measured_high"], False, 0, 0)
        table.add_row(str(r["load"]), f"{r['baseline_before_tok_s']:.1f} / {r['baseline_after_tok_s']:.1f}",
                      f"{r['paper_predicted_speedup']:.2f}", paper.text(), r["candidate"],
                      "—" if r["k"] is None else str(r["k"]), f"{r['predicted_speedup']:.2f}", mine.text())
    return table
