"""The table `specbench run` ends with: per subtask (or category) τ, tokens/s, TTFT, rounds, and the speedup
over a baseline run of the same model, dataset and settings on the same hardware, if the results root has
one. Also written as summary.md and summary.csv in the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from rich.console import Console

from specbench_cli.hardware import hardware_key
from specbench_cli.analysis.metrics import engine_error, group_column, replayed, summarise
from specbench_cli.analysis.results import BEFORE, SAME_EXPERIMENT, pairing_id
from specbench_cli.records import read_table
from specbench_cli.analysis.tables import Table



def find_baseline(run_dir: Path, me: dict) -> Path | None:
    """A complete `baseline` run beside this one (whose run.json is `me`) with the same settings and hardware;
    the same shard is preferred, then the newest."""
    if me["settings"]["method"] == "baseline":
        return None
    best: tuple[bool, float] | None = None
    found = None
    for other in run_dir.parent.glob("*/run.json"):
        info = json.loads(other.read_text())
        s = info.get("settings", {})
        if (s.get("method") == "baseline" and info.get("status") == "complete"
                and all(s.get(k, BEFORE.get(k)) == me["settings"].get(k, BEFORE.get(k)) for k in SAME_EXPERIMENT)
                and hardware_key(info.get("environment", {})) == hardware_key(me.get("environment", {}))):
            rank = (s.get("shard") == me["settings"].get("shard"), other.stat().st_mtime)
            if best is None or rank > best:
                best, found = rank, other.parent
    return found


def with_intervals(frame: pd.DataFrame, prompts: pd.DataFrame, baseline: pd.DataFrame | None,
                   paired: bool) -> pd.DataFrame:
    """The summary with the overall row's tokens/s and speedup intervals (the per-group rows hold too few prompts
    for one to mean much: left blank)."""
    from specbench_cli.analysis import intervals

    rate = intervals.mean_interval(prompts)
    speedup = intervals.speedup_interval(prompts, baseline, paired) if baseline is not None and len(baseline) else None
    overall = frame.index[-1]
    frame = frame.assign(**{"tokens/s 95% CI": "", "speedup 95% CI": ""})
    frame.loc[overall, "tokens/s 95% CI"] = rate.range(1)
    frame.loc[overall, "speedup 95% CI"] = speedup.labelled() if speedup is not None else "—"
    return frame


def replay_line(prompts: pd.DataFrame, info: dict) -> str:
    """What the greedy replay (greedy_replay.py) found, in one line; "" where nothing was replayed."""
    p = replayed(prompts)
    if p.empty:
        return ""
    off, ties = int(p.replay_off.sum()), int(p.replay_ties.sum())
    engine = info.get("settings", {}).get("engine", BEFORE["engine"])
    if engine != BEFORE["engine"] and off:  # another engine's numerics against ours: `report.replay_split`
        error = engine_error(p)
        measured = f"; its verify is within {error:.3g} logits of ours on these turns" if error == error else ""
        if info["settings"].get("method") == "baseline":
            weighed = " (a baseline does not speculate: no lossless question)"
        elif measured:
            weighed = "; report's replay table weighs them against that error"
        else:
            weighed = f"; report's replay table weighs them against {engine}'s own baseline"
        verdict = (f"{off} token(s) off, largest margin {p.replay_margin.max():.3g} logits: {engine}'s numerics "
                   f"against ours{measured}{weighed}")
        return (f"greedy replay of {engine}'s tokens on our {info.get('replay', '?')}: "
                f"{int(p.replay_checked.sum())} tokens, {verdict}")
    verdict = ("every token the reference's greedy choice" if not off else
               f"{off} token(s) off, all numeric ties (largest margin {p.replay_margin.max():.3g} logits)" if off == ties
               else f"{off - ties} MISMATCH(ES) beside {ties} numeric tie(s): a lossless bug")
    weights = " (of the same random weights)" if info.get("random_weights") else ""
    return f"greedy replay on the {info.get('replay', '?')}{weights}: {int(p.replay_checked.sum())} tokens, {verdict}"


def random_note(info: dict) -> str:
    """A random target's mark on a table's note (its title names the model random:NAME)."""
    weights = info.get("random_weights")
    return (f"random weights of {weights['architecture']} (seed {weights['seed']}): timings are the architecture's, "
            "tokens mean nothing; " if weights else "")


def print_summary(run_dir: Path, console: Console) -> pd.DataFrame:
    prompts = read_table(run_dir, "prompts")
    info = json.loads((run_dir / "run.json").read_text())
    base_dir = find_baseline(run_dir, info)
    baseline = read_table(base_dir, "prompts") if base_dir else None
    s = info["settings"]
    engine = "" if s.get("engine", BEFORE["engine"]) == BEFORE["engine"] else f"{s['engine']}:"
    title = f"{engine}{s['method']} · {s['model']} · {s['dataset']} · {s.get('dtype', 'float32')} ({info['clock']} clock)"
    note = (random_note(info) + (f"dtype: {info['dtype_choice']}; " if info.get("dtype_choice") else "") + "τ: decoded tokens per round; tokens_per_s: mean over prompts of each prompt's decode rate; "
            + (f"speedup vs {base_dir}" if base_dir else "speedup: no matching baseline run beside this one")
            + (f"; rounds are {s['engine']} engine steps, whose phase times the engine does not expose (null, not 0)"
               if engine else ""))
    frame = with_intervals(summarise(prompts, group_column(prompts), baseline), prompts, baseline,
                           paired=base_dir is not None and pairing_id(info) is not None
                           and pairing_id(info) == pairing_id(json.loads((base_dir / "run.json").read_text())))
    table = Table("summary", title, frame, note + "; 95% CI of the overall row: analysis/intervals.py (report's overview)")
    console.print(table.rich())
    table.write(run_dir)
    console.print(f"results in {run_dir}: records (rounds.parquet, prompts.parquet), run.json, summary.md/.csv",
                  highlight=False, soft_wrap=True)
    line = replay_line(prompts, info)
    if line:
        console.print(line, highlight=False, soft_wrap=True)
    if base_dir is None and s["method"] != "baseline":
        console.print(f"for a speedup, run the baseline with the same settings into {run_dir.parent} (specbench run "
                      f"--method baseline and the same --model, --dataset, --max-new-tokens, --temperature, --dtype), "
                      f"then: specbench report {run_dir.parent}", highlight=False, soft_wrap=True)
    elif s["method"] == "baseline":
        console.print(f"runs of other methods beside it get a speedup against it; compare them all with: "
                      f"specbench report {run_dir.parent}", highlight=False, soft_wrap=True)
    return table.frame
