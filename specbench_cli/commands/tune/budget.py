"""What `specbench tune` does: the baseline live, the verify cost curve, a trace replay per candidate budget,
the choice, and live runs of it interleaved with a baseline (the model behind the choice is `pricing.py`).

The tune folder is held for the whole tune (`tune_command`: `folders.claim`, one writer; an existing folder is
continued, each run inside it resuming where it stopped), and its records are written whole or not at all
(`budgets.write_record`): tune.json there and the registered copy `run --tuned` reads.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from rich.table import Table as RichTable

from specbench_cli import budgets
from specbench_cli.commands.tune import pricing as tuning
from specbench_cli.analysis import intervals
from specbench_cli.core.attention import attends_by_matmul
from specbench_cli.core.target import Target
from specbench_cli.commands.interleave import record_plans
from specbench_cli.loading import load_model
from specbench_cli.commands.oracle import command as oracle_run
from specbench_cli.commands.oracle.command import OracleConfig
from specbench_cli.planning import method_weights, plan
from specbench_cli.records import read_table
from specbench_cli.run_folder import record_run
from specbench_cli.commands.train.train import command_line
from specbench_cli.core.dtypes import dtype_name


@dataclass
class TuneConfig:
    method: str
    run: object  # inputs.RunConfig: model, dataset, selection, tokens, dtype, device; out = the tune folder
    threads: int
    check: bool = True  # run the chosen budget (and the paper's) live beside the baseline


def tune_one(config: TuneConfig, console) -> budgets.TuneRecord:
    """Baseline live, the cost curve, a replay per candidate, the choice, and (`check`) live runs of it (in the
    tune folder `tune_command` holds)."""
    run, out, method = config.run, config.run.out, config.method
    base = plan(dataclasses.replace(run, method="baseline", out=out / "baseline", resume=_exists(out / "baseline")),
                dict(os.environ))
    model = load_model(base.spec, base.device, base.dtype)
    record_run(base, console, model)
    base_ms = per_token_ms(read_table(out / "baseline", "prompts"))
    machine = budgets.machine_key(base.dtype, base.device, config.threads, base.batch_invariant)
    where = f"{run.model} {machine}, perf_counter"
    costs, costs_file = tuning.cached_costs(f"{run.model}-{machine}", lambda: tuning.measure_costs(
        Target(model.model, base.device, invariant=base.batch_invariant), model.model.config.vocab_size, where=where))
    console.print(f"verify cost c(n) on {where} ({costs_file}): t(1) {costs.t1_ms:.1f} ms, "
                  + ", ".join(f"c({n}) {c:.2f}" for n, c in costs.c.items()), highlight=False, soft_wrap=True)

    reverifies = base.batch_invariant and not attends_by_matmul(base.device, base.dtype)
    predictions = [tuning.predict(candidate, walks, costs, base_ms, reverifies)
                   for candidate, walks in replay_walks(config, base, model, console)]
    paper, best = predictions[0], tuning.choose(predictions)

    measured: dict[str, intervals.Interval] = {}
    if config.check:
        measured = live_check(config, [best] + ([paper] if paper is not best else []), predictions, model, console)

    frame = pd.DataFrame([asdict(p) for p in predictions]).drop(columns="opts")
    frame["measured_speedup"] = frame.candidate.map({k: v.value for k, v in measured.items()})
    frame["measured_low"] = frame.candidate.map({k: v.low for k, v in measured.items()})
    frame["measured_high"] = frame.candidate.map({k: v.high for k, v in measured.items()})
    frame.to_csv(out / "candidates.csv", index=False)
    from specbench_cli.analysis import plots

    plots.save(plots.tune_candidates(frame, f"tune {method}: {where}"), out, "candidates")
    table = RichTable(title=f"tune {method} on {where}: baseline {1e3 / base_ms:.1f} tok/s", show_lines=False,
                      caption="ms per round; × = speedup over the baseline; * = chosen (the most predicted tokens/s); "
                              "meas. ×: run live interleaved with a baseline, prompt by prompt, with its 95% interval")
    table.add_column("candidate", overflow="fold")
    for col in ("τ", "nodes", "draft", "verify", "round", "pred. ×", "meas. ×"):
        table.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    for p in predictions:
        table.add_row(("* " if p is best else "  ") + p.candidate, f"{p.tau:.2f}", f"{p.mean_draft:.1f}",
                      f"{p.draft_ms:.1f}", f"{p.verify_ms:.1f}", f"{p.round_ms:.1f}", f"{p.speedup:.2f}",
                      measured[p.candidate].text() if p.candidate in measured else "—")
    console.print(table)

    live = {k: v.value for k, v in measured.items()}
    record = budgets.TuneRecord(run.model, method, machine, list(best.opts), best.speedup, live.get(best.candidate),
                        paper.speedup, live.get(paper.candidate), str(out), command_line(),
                        dt.datetime.now().isoformat(timespec="seconds"), frame.to_dict("records"),
                        weights=method_weights(base, run))
    registered = budgets.write_record(record, out, csv=False)
    console.print(f"chosen: {best.candidate} (predicted {best.speedup:.2f}×"
                  + (f", measured {measured[best.candidate].text()}×" if best.candidate in measured else "")
                  + f"); `specbench run --method {method} --tuned` uses it ({registered})", highlight=False, soft_wrap=True)
    return record


def replay_walks(config: TuneConfig, base, model, console) -> list[tuple[tuple[str, ...], list[pd.DataFrame]]]:
    """Each candidate budget (the paper's first) replayed along the baseline's greedy traces (`<out>/replay_cold_<i>`,
    resumed where it stopped): its walks, one frame per turn (accepted, drafted, branched, draft_ms per position)."""
    run, method = config.run, config.method
    walks = []
    for i, candidate in enumerate([(), *budgets.GRIDS[method]]):
        folder = run.out / f"replay_cold_{i}"  # drafts timed after a target forward (replay_{i}: before that, hot)
        oracle_run.run_oracle(OracleConfig([method], dataclasses.replace(run, dtype=dtype_name(base.dtype), out=folder,
                                                                       resume=_exists(folder)),
                                        [f"{method}.{o}" for o in candidate], cold_drafts=True), console, model)
        replay = read_table(folder, "replay")
        walks.append((candidate, [g.sort_values("position") for _, g in replay.groupby(["prompt_id", "turn"], sort=False)]))
    return walks


def live_check(config: TuneConfig, chosen: list, predictions: list, model, console) -> dict[str, intervals.Interval]:
    """The chosen budget (and the paper's) run live, interleaved prompt by prompt with a baseline of their own
    (`interleave.record_plans`), so the measured speedups share the machine's drift with their baseline; each
    with its paired 95 % interval (`analysis/intervals.py`)."""
    run, out = config.run, config.run.out
    folders = [out / "live_baseline", *(out / f"live_{predictions.index(p)}" for p in chosen)]  # i: candidate i
    configs = [dataclasses.replace(run, method="baseline", out=folders[0], resume=_exists(folders[0])),
               *(dataclasses.replace(run, method=config.method, out=f, resume=_exists(f), opts=[*p.opts])
                 for f, p in zip(folders[1:], chosen))]
    record_plans([plan(c, dict(os.environ)) for c in configs], model, 1, console)
    base = read_table(folders[0], "prompts")
    return {p.candidate: intervals.speedup_interval(read_table(f, "prompts"), base, paired=True)
            for f, p in zip(folders[1:], chosen)}


def per_token_ms(prompts: pd.DataFrame) -> float:
    """Decode time per token over a run's prompts, pooled (every token weighs the same)."""
    return float(prompts.decode_ms.sum() / max(prompts.decode_tokens.sum(), 1))


def _exists(folder: Path) -> bool:
    return (folder / "run.json").exists()
