"""`report --compare REF`: the regression gate of a nightly job, which fails for real regressions only.

Per (model, dataset, method) of the reference:
- **outputs and τ, exactly.** At temperature 0 a run's outputs and τ are fixed by the engine, dtype and weights,
  so any change is real: a changed output fails, naming the prompt, turn, token and round; a τ that fell fails,
  naming the first round whose accepted length differs; a τ that rose is reported, not failed.
- **speed, with its noise.** The ratio current speedup / reference speedup gets a bootstrap interval
  (`intervals.change_interval`; each speedup paired where its run was interleaved with its baseline), and so
  does each method's tokens/s now / the reference's (`intervals.rate_change_interval`: an engine that got slower
  slows the baseline too, which no speedup shows). Each fails only where the whole interval lies below
  1 - threshold, passes where it lies at or above it, and is otherwise *inconclusive*: its own exit code (3),
  with about how many passes (`run --repeat`) would decide it.
- a reference row the current results lack fails; a temperature-0 mismatch in the lossless or replay table fails.

Runs whose settings differ from the reference's (dtype, lengths, hardware...) are refused with one line naming
what differs: their ratio would not mean anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from specbench_cli.analysis import intervals
from specbench_cli.analysis.metrics import first_pass
from specbench_cli.analysis.results import SAME_EXPERIMENT, BEFORE, Results, RunGroup
from specbench_cli.analysis.tables import Table
from specbench_cli.core.errors import UsageError

INCONCLUSIVE_EXIT = 3  # 0 pass, 1 regression, 2 bad input (every command's)


@dataclass
class GateResult:
    failed: list[str] = field(default_factory=list)
    inconclusive: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # changes that are not failures (τ rose)
    rows: list[dict] = field(default_factory=list)  # the speed table


def key(group: RunGroup) -> tuple[str, str, str]:
    s = group.info["settings"]
    return s["model"], s["dataset"], group.label


def compare(current: Results, reference: Results, threshold_pct: float, lossless: Table | None = None,
            replay: Table | None = None) -> GateResult:
    now = {key(g): g for g in current.groups}
    result = GateResult()
    for ref in reference.groups:
        name = "/".join(key(ref))
        mine = now.get(key(ref))
        if mine is None:
            result.failed.append(f"{name}: missing from the current results")
            continue
        check_comparable(mine, ref)
        outputs(mine, ref, name, result)
        speed(current, reference, mine, ref, name, threshold_pct / 100, result)
        tokens_per_s(mine, ref, name, threshold_pct / 100, result)
    for row in lossless.frame.to_dict("records") if lossless is not None else []:
        if row.get("mismatches"):
            result.failed.append(f"{row['dataset']}/{row['method']}: {row['mismatches']} output(s) diverge from the "
                                 f"baseline where the target had no near-tie (a lossless bug): "
                                 f"{row['first divergences (prompt/turn@token)']}")
    for row in replay.frame.to_dict("records") if replay is not None else []:
        if row.get("mismatches"):
            result.failed.append(f"{row['dataset']}/{row['method']}: {row['mismatches']} token(s) the reference "
                                 f"target would not have chosen, with no near-tie there (a lossless bug): "
                                 f"{row['first off (prompt/turn@token)']}")
    return result


def check_comparable(mine: RunGroup, ref: RunGroup) -> None:
    """One line naming every setting (and the hardware) that differs between a run and its reference."""
    a, b = mine.info["settings"], ref.info["settings"]
    differ = [f"{k} {json.dumps(b.get(k, BEFORE.get(k)))} -> {json.dumps(a.get(k, BEFORE.get(k)))}"
              for k in SAME_EXPERIMENT if a.get(k, BEFORE.get(k)) != b.get(k, BEFORE.get(k))]
    if mine.hardware != ref.hardware:
        differ.append(f"hardware {ref.hardware} -> {mine.hardware}")
    if differ:
        raise UsageError(f"--compare: {'/'.join(key(ref))} was run differently from the reference "
                         f"({'; '.join(differ)}); compare runs of the same settings on the same machine")


def outputs(mine: RunGroup, ref: RunGroup, name: str, result: GateResult) -> None:
    """Temperature 0 only: each prompt turn's output ids and τ against the reference's (the first pass of each)."""
    if mine.info["settings"].get("temperature", 0) != 0 or ref.info["settings"].get("temperature", 0) != 0:
        return
    now = first_pass(mine.prompts).set_index(["prompt_id", "turn"])
    then = first_pass(ref.prompts).set_index(["prompt_id", "turn"])
    for (prompt, turn), old in then.iterrows():
        if (prompt, turn) not in now.index:
            result.failed.append(f"{name}: prompt {prompt} turn {turn} missing from the current results")
            continue
        new = now.loc[(prompt, turn)]
        a, b = [int(t) for t in old.output_ids], [int(t) for t in new.output_ids]
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            result.failed.append(f"{name}: prompt {prompt} turn {turn}: output changed at token {at} "
                                 f"(round {_round_of(mine, prompt, turn, at)}): token id {_id(a, at)} -> {_id(b, at)}")
        elif old.tau != new.tau:
            line = (f"{name}: prompt {prompt} turn {turn}: τ {old.tau:.3f} -> {new.tau:.3f}, first at "
                    f"{_first_round_apart(mine, ref, prompt, turn)}")
            (result.failed if new.tau < old.tau else result.notes).append(line)


def _id(ids: list[int], at: int) -> str:
    """The token id at `at`, or "end" where the output stopped before it."""
    return str(ids[at]) if at < len(ids) else "end"


def _rounds(group: RunGroup, prompt: str, turn: int) -> pd.DataFrame:
    r = group.rounds
    r = r[(r.prompt_id == prompt) & (r.turn == turn)]
    return first_pass(r).sort_values("round")


def _round_of(group: RunGroup, prompt: str, turn: int, token: int) -> int:
    """The round that emitted output token `token` (the prefill emits token 0: round -1)."""
    emitted = 1
    for r in _rounds(group, prompt, turn).itertuples():
        emitted += r.emitted
        if emitted > token:
            return int(r.round)
    return -1


def _first_round_apart(mine: RunGroup, ref: RunGroup, prompt: str, turn: int) -> str:
    a, b = _rounds(ref, prompt, turn), _rounds(mine, prompt, turn)
    for (_, old), (_, new) in zip(a.iterrows(), b.iterrows()):
        if old.accepted != new.accepted:
            return f"round {int(new['round'])} (accepted {int(old.accepted)} -> {int(new.accepted)})"
    return "the last round"


def speed(current: Results, reference: Results, mine: RunGroup, ref: RunGroup, name: str, threshold: float,
          result: GateResult) -> None:
    """current speedup / reference speedup with its interval, and the verdict."""
    base_now, base_then = current.baseline_for(mine), reference.baseline_for(ref)
    if mine.method == "baseline" or base_now is None or base_then is None:
        return  # an A/A pair's second baseline measures noise, not a speedup to keep
    change = intervals.change_interval((mine.prompts, base_now.prompts, current.paired(mine, base_now)),
                                       (ref.prompts, base_then.prompts, reference.paired(ref, base_then)))
    judge(change, f"speedup now/reference {change.text(3)} (95% CI, {change.pairing} runs",
          "speedup", mine, ref, name, threshold, result)


def tokens_per_s(mine: RunGroup, ref: RunGroup, name: str, threshold: float, result: GateResult) -> None:
    """tokens/s now / tokens/s of the reference (`intervals.rate_change_interval`): an engine that got slower
    slows a method and its baseline alike, which no speedup shows. The reference needs two passes or more, whose
    spread is the noise the interval goes by."""
    drift = intervals.pass_ratio_samples(ref.prompts, np.random.default_rng(intervals.SEED))
    if not drift[2]:
        result.notes.append(f"{name}: tokens/s not gated: the reference has one pass, which says nothing of the "
                            "machine's noise (record references with run --repeat 2 or more)")
        return
    change = intervals.rate_change_interval(mine.prompts, ref.prompts, drift)
    now, then = (float(intervals.rates(g.prompts).rate.mean()) for g in (mine, ref))
    judge(change, f"tokens/s {then:.2f} -> {now:.2f}, now/reference {change.text(3)} (95% CI, unpaired runs "
          "widened by the reference's pass-to-pass noise", "tokens/s", mine, ref, name, threshold, result)


def judge(change: intervals.Interval, what: str, measure: str, mine: RunGroup, ref: RunGroup, name: str,
          threshold: float, result: GateResult) -> None:
    """A ratio now/reference against the floor 1 - threshold: its row in the gate's table and its verdict line."""
    passes = int(mine.prompts.repeat.nunique()) if len(mine.prompts) else 1
    verdict = intervals.verdict(change, threshold, passes)
    line = f"{name}: {what}, {change.prompts} prompts x {passes} passes) against the floor {1 - threshold:.3f}"
    result.rows.append({"model": key(ref)[0], "dataset": key(ref)[1], "method": key(ref)[2], "measure": measure,
                        "now / reference": change.value, "low": change.low, "high": change.high,
                        "verdict": verdict.outcome, "passes needed": verdict.passes_needed})
    if verdict.outcome == "regression":
        result.failed.append(f"{line}: a regression")
    elif verdict.outcome == "pass":
        result.passed.append(line)
    else:
        more = (f"about {verdict.passes_needed} passes (run --repeat {verdict.passes_needed}) would decide it"
                if verdict.passes_needed else "the estimate sits on the floor: more passes may not decide it")
        result.inconclusive.append(f"{line}: inconclusive; {more}")


def table(result: GateResult, threshold_pct: float) -> Table:
    return Table("regression_gate", "Speed against the reference (report --compare)", pd.DataFrame(result.rows),
                 f"a regression only where the whole 95% interval of now/reference lies below 1 - {threshold_pct:g}%; "
                 "inconclusive where it straddles that floor. speedup: over each run's own baseline; tokens/s: the "
                 "engine's own speed, runs of different times, the interval widened by the reference's "
                 "pass-to-pass noise")
