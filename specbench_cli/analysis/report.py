"""`specbench report`: the paper tables from any number of results directories, and the regression gate.

Every number comes from the metric definitions in `specbench_cli.analysis.metrics` (τ, tokens/s, speedup), so a
report and the table `run` prints never disagree. A speedup is computed only against a `baseline` run of
the same model, dataset, settings and hardware; the table names which baseline directory was used.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from specbench_cli.analysis import cross_engine, intervals
from specbench_cli.analysis import oracles as oracle
from specbench_cli.analysis import scaling
from specbench_cli.datasets import dataset_slug
from specbench_cli.analysis.metrics import (along_response, engine_error, first_divergence, first_pass, group_column,
                                           histogram, position_acceptance, replayed, summarise, tau_turn_mean)
from specbench_cli.analysis.phases import CONTEXT_BIN, MIN_BIN_ROUNDS, PARTS, draft_by_context, split
from specbench_cli.analysis.results import BEFORE, Results, RunGroup
from specbench_cli.analysis.tables import Table

NAN = float("nan")


def datasets(results: Results) -> list[str]:
    return list(dict.fromkeys(g.info["settings"]["dataset"] for g in results.groups))


def in_dataset(results: Results, dataset: str) -> list[RunGroup]:
    return [g for g in results.groups if g.info["settings"]["dataset"] == dataset]


def _speedup_source(results: Results, group: RunGroup) -> tuple[pd.DataFrame | None, str, bool]:
    """The baseline prompts to divide by, a note saying where they came from (or why there are none), and whether
    they were measured interleaved with the group's (`Results.paired`). The second baseline of an A/A pair is
    divided by the first: its "speedup" is the machine's noise."""
    if group.method == "baseline" and not group.second_of_pair:
        return None, "—", False
    base = results.baseline_for(group)
    if base is not None:
        return base.prompts, ", ".join(f"{d.parent.name}/{d.name}" for d in base.dirs), results.paired(group, base)
    elsewhere = results.baseline_elsewhere(group)
    if elsewhere is not None:
        return None, f"baseline only on other hardware ({elsewhere.hardware}): not compared", False
    return None, "no baseline run of the same settings", False


def overview(results: Results) -> Table:
    """One row per run group: overall τ, tokens/s and speedup with their 95 % intervals, TTFT, the baseline used;
    the note says how the intervals were made and how much noise the records show."""
    rows = []
    for g in results.groups:
        base, source, paired = _speedup_source(results, g)
        total = summarise(g.prompts, group_column(g.prompts), base).iloc[-1]
        rate = intervals.mean_interval(g.prompts)
        speedup = intervals.speedup_interval(g.prompts, base, paired) if base is not None else intervals.NOTHING
        s = g.info["settings"]
        rows.append({"dataset": s["dataset"], "model": s["model"], "method": g.label, "prompts": int(total.prompts),
                     "passes": int(g.prompts.repeat.nunique()) if len(g.prompts) else 0,
                     "τ": total.tau, "τ turn-mean": tau_turn_mean(g.prompts), "tokens/s": total.tokens_per_s,
                     "tokens/s 95% CI": rate.range(1),
                     "TTFT ms": total.ttft_ms, "speedup": total.speedup,
                     "speedup 95% CI": speedup.labelled(),
                     "baseline": source, "clock": g.info.get("clock", "?"), "hardware": g.hardware})
    return Table("overview", "Overall per run (τ = mean acceptance length, bonus included; decode tokens/s)",
                 pd.DataFrame(rows), "τ: Σ decoded tokens / Σ rounds (vLLM, SGLang, Spec-Bench); τ turn-mean: the mean "
                 "of each prompt turn's τ (specdec_bench's Average_AL); τ has no interval: at temperature 0 it is "
                 "fixed by the engine, dtype and weights. 95% CI: bootstrap over prompts (each with all its passes), "
                 "expanded percentile; paired where the runs were interleaved (run --method a,b), unpaired (wider, "
                 "blind to drift between the runs) otherwise. " + noise_line(results))


def noise_line(results: Results) -> str:
    """What the records say of the machine's noise: an A/A pair's ratio (baseline-2 over baseline), else a
    baseline's odd passes over its even ones, as the smallest speedup difference they could detect."""
    lines = []
    for g in results.groups:
        base = results.baseline_for(g) if g.method == "baseline" and g.second_of_pair else None
        if base is not None:
            noise = intervals.speedup_interval(g.prompts, base.prompts, results.paired(g, base))
            source = f"A/A {g.label}/{base.label} {noise.text(3)}"
        elif g.method == "baseline" and not g.second_of_pair and g.prompts.repeat.nunique() > 1:
            noise = intervals.noise_from_passes(g.prompts)
            source = f"{g.label}'s odd/even passes {noise.text(3)}"
        else:
            continue
        lines.append(f"Noise ({g.info['settings']['dataset']}, {source}): speedup differences under "
                     f"{100 * intervals.detectable(noise):.1f} % are within what this machine's noise allows here.")
    return " ".join(lines) or ("Noise: not measured (run --method baseline,baseline, or --repeat 2 or more, "
                               "to measure it).")


def by_group(results: Results, dataset: str, by: str) -> Table:
    """τ and speedup per subtask or category, one row per method: the Spec-Bench subtask table
    (`by="subtask"`) and the WhiFlash-style category table (`by="category"`)."""
    rows = []
    order: list[str] = []
    for g in in_dataset(results, dataset):
        base, _, _ = _speedup_source(results, g)
        table = summarise(g.prompts, by, base)
        order += [k for k in table[by] if k not in order]
        row = {"model": g.info["settings"]["model"], "method": g.label}
        for r in table.itertuples(index=False):
            row[f"{getattr(r, by)} τ"], row[f"{getattr(r, by)} ×"] = r.tau, r.speedup
        rows.append(row)
    order = [k for k in order if k != "overall"] + ["overall"]
    columns = ["model", "method", *(f"{k} {m}" for k in order for m in ("τ", "×"))]
    name = "subtasks" if by == "subtask" else "categories"
    return Table(f"{name}_{dataset_slug(dataset)}", f"{dataset}: τ and speedup (×) per {by}", pd.DataFrame(rows, columns=columns),
                 "× is left blank where no baseline run of the same settings and hardware exists")


def group_intervals(results: Results, dataset: str, by: str) -> Table:
    """The intervals of the per-subtask (or category) table, long and numeric (files only): per method and group,
    tokens/s and speedup with their 95 % bounds. A group of two prompts gives a wide interval, honestly."""
    rows = []
    for g in in_dataset(results, dataset):
        base_prompts, _, paired = _speedup_source(results, g)
        for name, mine in [*g.prompts.groupby(by, sort=False), ("overall", g.prompts)]:
            rate = intervals.mean_interval(mine)
            base = base_prompts[base_prompts[by] == name] if base_prompts is not None and name != "overall" else base_prompts
            speedup = intervals.speedup_interval(mine, base, paired) if base is not None and len(base) else intervals.NOTHING
            rows.append({"model": g.info["settings"]["model"], "method": g.label, by: name, "prompts": rate.prompts,
                         "tokens/s": rate.value, "tokens/s low": rate.low, "tokens/s high": rate.high,
                         "speedup": speedup.value, "speedup low": speedup.low, "speedup high": speedup.high,
                         "pairing": speedup.pairing if speedup.prompts else ""})
    table = Table(f"intervals_{dataset_slug(dataset)}", f"{dataset}: tokens/s and speedup per {by} with 95% intervals",
                  pd.DataFrame(rows), "bootstrap over prompts, expanded percentile (analysis/intervals.py); paired where "
                  "the runs were interleaved")
    table.terminal = False
    return table


def routing(results: Results) -> Table:
    """HVD Table 11's view of every run: target cycles (verify forwards) per 1K decoded tokens, τ, tokens/s,
    and for routed runs the share of rounds each drafter took (columns: drafters seen in a routed run)."""
    mixed = [g for g in results.groups if g.rounds.proposer.nunique() > 1]
    drafters = sorted({p for g in mixed for p in g.rounds.proposer.unique()})
    rows = []
    for g in results.groups:
        tokens = g.prompts.decode_tokens.sum()
        total = summarise(g.prompts, group_column(g.prompts)).iloc[-1]
        row = {"dataset": g.info["settings"]["dataset"], "method": g.label, "rounds": len(g.rounds),
               "cycles / 1K tokens": 1e3 * g.rounds.target_forwards.sum() / tokens if tokens else NAN,
               "τ": total.tau, "tokens/s": total.tokens_per_s,
               "tokens/s 95% CI": intervals.mean_interval(g.prompts).range(1)}
        shares = g.rounds.proposer.value_counts(normalize=True)
        known = set(shares.index) <= set(drafters)
        row.update({f"{d} %": 100 * shares.get(d, 0.0) if known else NAN for d in drafters})
        rows.append(row)
    return Table("routing", "Target cycles per 1K decoded tokens and the drafters' shares of rounds", pd.DataFrame(rows),
                 "a cycle is one target verify forward; shares are left blank for runs of other drafters")


HYBRID_PARTS = ("eagle3", "suffix")  # what a Hybrid Verified Decoding run chooses between


def hybrid(results: Results) -> Table:
    """HVD Table 3's form: each hybrid run (rounds from both the suffix cache and EAGLE-3) against the EAGLE-3 and
    suffix runs of the same experiment (engine, dataset, settings) and hardware: its speedup over each (ratio of
    decode tokens/s on the prompts both ran), τ of all three, and the share of steps that verified the cache."""
    rows = []
    for g in results.groups:
        if set(g.rounds.proposer.unique()) != set(HYBRID_PARTS):
            continue
        total = summarise(g.prompts, group_column(g.prompts)).iloc[-1]
        row = {"dataset": g.info["settings"]["dataset"], "engine": g.info["settings"].get("engine", "specbench"),
               "method": g.label, "τ": total.tau, "tokens/s": total.tokens_per_s}
        for name in HYBRID_PARTS:
            part = results.beside(g, name)
            mine = summarise(g.prompts, group_column(g.prompts), part.prompts if part else None).iloc[-1]
            row[f"{name} τ"] = summarise(part.prompts, group_column(part.prompts)).iloc[-1].tau if part else NAN
            row[f"× {name}"] = mine.speedup
            row[f"× {name} 95% CI"] = (intervals.speedup_interval(g.prompts, part.prompts, results.paired(g, part))
                                       .labelled() if part is not None else "—")
        row["cache steps %"] = 100 * (g.rounds.proposer == "suffix").mean()
        rows.append(row)
    return Table("hybrid", "Hybrid Verified Decoding against its two drafters (HVD Table 3's form)", pd.DataFrame(rows),
                 "× name: the hybrid's decode tokens/s over that run's on the same prompts (same engine, settings and "
                 "hardware); blank where no such run exists; cache steps: rounds that verified the suffix-cache draft")


def positions(results: Results, depth: int = 8) -> Table:
    """Per-position acceptance (vLLM's rate and the conditional rate) for every drafting method."""
    rows = []
    for g in results.groups:
        pos = position_acceptance(g.rounds, depth)
        if g.rounds.tree_size.gt(0).any():
            row = {"dataset": g.info["settings"]["dataset"], "method": g.label}
            row.update({f"α{r.position}": r.rate for r in pos.itertuples()})
            row.update({f"α{r.position}|{r.position - 1}": r.conditional for r in pos.itertuples()})
            rows.append(row)
    return Table("acceptance_positions", "Per-position acceptance: αk = P(accepted ≥ k); αk|k-1 = P(k accepted | k-1 "
                 "accepted, draft reached k)", pd.DataFrame(rows))


def lengths(results: Results, longest: int = 16) -> Table:
    """The acceptance-length histogram of every drafting method: % of rounds that emitted exactly n tokens
    (accepted + bonus), lengths past `longest` pooled into the last column."""
    rows = []
    for g in results.groups:
        if not g.rounds.tree_size.gt(0).any():
            continue
        h = histogram(g.rounds).set_index("length").share * 100
        row = {"dataset": g.info["settings"]["dataset"], "method": g.label, "rounds": len(g.rounds)}
        row.update({str(n): h.get(n, 0.0) for n in range(1, min(int(h.index.max()), longest) + 1)})
        if h.index.max() > longest:
            row[f"{longest}"], row[f">{longest}"] = h.get(longest, 0.0), h[h.index > longest].sum()
        rows.append(row)
    return Table("acceptance_histogram", "Acceptance-length histogram: % of rounds emitting exactly n tokens "
                 "(accepted + bonus)", pd.DataFrame(rows).fillna(0.0) if rows else pd.DataFrame())


Classifier = Callable[[dict, list[int], int, int], str]  # (run info, prefix, baseline token, method token) -> kind
MARKS = {"numeric tie": " tie", "mismatch": " MISMATCH", "inherited": " after"}


def _ids(value) -> list[int]:
    """Token ids from a record cell; [] where the run predates the column."""
    return [] if value is None or isinstance(value, float) else [int(t) for t in value]


PASS_TURN = ["prompt_id", "turn", "repeat"]


NOT_CHECKED = "not checked: --acceptance set its decisions (not lossless by construction)"


def lossless(results: Results, classify: Classifier | None = None) -> Table:
    """For every method group: the share of prompt turns whose output ids equal the baseline's, where the first
    differing ones diverge (Spec-Bench #6: a boolean hides late numeric drift) and, at temperature 0, whether
    each divergence is a numeric tie of the run's dtype or a mismatch (`classify`; see divergence.py)."""
    rows = []
    for g in results.groups:
        base = results.baseline_for(g)
        if g.method == "baseline" or base is None:
            continue
        if g.info["settings"].get("acceptance"):  # the user set the decisions: not lossless by construction
            rows.append({"dataset": g.info["settings"]["dataset"], "method": g.label,
                         "temperature": g.info["settings"]["temperature"], "turns compared": 0, "identical": NAN,
                         "first divergences (prompt/turn@token)": NOT_CHECKED})
            continue
        base_prompts = judged(results, base)
        theirs = base_prompts.drop_duplicates(PASS_TURN).set_index(PASS_TURN)
        first = first_pass(base_prompts).set_index(["prompt_id", "turn"])
        temperature = g.info["settings"]["temperature"]
        exact = _exact_pair(g.info["settings"], base.info["settings"])
        diverged, kinds, shared = [], [], 0
        for r in judged(results, g).itertuples(index=False):
            key = (r.prompt_id, r.turn, r.repeat)  # the baseline's turn of the same pass, else of its first pass
            if key not in theirs.index and key[:2] not in first.index:
                continue
            shared += 1
            reference = theirs.loc[key] if key in theirs.index else first.loc[key[:2]]
            ours, expected = list(r.output_ids), list(reference.output_ids)
            at = first_divergence(ours, expected)
            if at is None:
                continue
            kind = "unclassified"
            prompt, mine = _ids(reference.get("prompt_ids")), _ids(getattr(r, "prompt_ids", None))
            if prompt and mine and prompt != mine:
                kind = "inherited"  # a later turn whose prompt holds an earlier turn's different answer
            elif exact and temperature == 0:
                kind = "mismatch"  # both computed every row as a one-token decode: no rounding excuses it
            elif temperature == 0 and (replayed := _replay_kind(r, reference)) is not None:
                kind = replayed
            elif classify is not None and temperature == 0 and prompt and at < min(len(ours), len(expected)):
                kind = classify(g.info, prompt + expected[:at], expected[at], ours[at])
            kinds.append(kind)
            diverged.append(f"{r.prompt_id}/{r.turn}@{at}" + MARKS.get(kind, ""))
        rows.append({"dataset": g.info["settings"]["dataset"], "method": g.label, "temperature": temperature,
                     "turns compared": shared, "identical": (shared - len(diverged)) / shared if shared else NAN,
                     "numeric ties": kinds.count("numeric tie"), "mismatches": kinds.count("mismatch"),
                     "inherited": kinds.count("inherited"), "unclassified": kinds.count("unclassified"),
                     "first divergences (prompt/turn@token)": " ".join(diverged[:6]) + (" …" if len(diverged) > 6 else "")})
    return Table("lossless", "Lossless check against the baseline run (at temperature 0 every method must be 1.00; "
                 "a divergence is a numeric tie when both tokens are within the dtype's threshold of the target's top "
                 "logit there: by the two turns' greedy replays, else recomputed in the run's dtype)",
                 pd.DataFrame(rows), "at temperature > 0 outputs differ by design; compare distributions instead")


def _replay_kind(ours, theirs) -> str | None:
    """A divergence of two replayed turns (greedy_replay.py): a numeric tie when neither has a mismatch, since where two
    runs first part, with the same tokens before, the reference's choice is one and the run that left it did so
    by a tie; None where either turn was not replayed (the float32 classifier decides)."""
    counts = [(getattr(ours, "replay_checked", -1), getattr(ours, "replay_off", -1), getattr(ours, "replay_ties", -1)),
              (theirs.get("replay_checked", -1), theirs.get("replay_off", -1), theirs.get("replay_ties", -1))]
    if any(pd.isna(checked) or checked < 0 for checked, _, _ in counts):
        return None
    return "numeric tie" if all(off == ties for _, off, ties in counts) else "mismatch"


def replay(results: Results) -> Table:
    """Every run's greedy replay (greedy_replay.py): of the tokens it emitted at temperature 0, how many the reference
    target would not have chosen after the turn's earlier tokens, as numeric ties and mismatches (`replay_split`)."""
    rows = []
    for g in results.groups:
        p = replayed(g.prompts)
        if p.empty:
            continue
        off = p[p.replay_off > 0]
        ties, threshold = replay_split(results, g, p)
        rows.append({"dataset": g.info["settings"]["dataset"], "method": g.label,
                     "reference": g.info.get("replay", "?"), "turns": len(p), "tokens": int(p.replay_checked.sum()),
                     "off": int(p.replay_off.sum()), "numeric ties": int(ties.sum()),
                     "mismatches": int((p.replay_off - ties).sum()), "tie threshold": threshold,
                     "turns exact": float((p.replay_off == 0).mean()),
                     "largest margin": float(p.replay_margin.max()),
                     "first off (prompt/turn@token)": " ".join(f"{r.prompt_id}/{r.turn}@{r.replay_first_off}"
                                                               for r in off.head(6).itertuples())
                     + (" …" if len(off) > 6 else "")})
    return Table("replay", "Greedy replay: every emitted token against the reference target's choice after the turn's "
                 "earlier tokens (a batch-invariant run must have none off; elsewhere only numeric ties)",
                 pd.DataFrame(rows), "off: tokens the reference would not have chosen; margin: the reference's top "
                 "logit minus the emitted token's. Our engine's runs: a numeric tie is within the dtype's threshold "
                 "of the top logit (bf16 0.5 logits), a mismatch anything else. Another engine's runs measure its "
                 "numerics against ours: its baseline, which does not speculate, has ties only; its other runs' "
                 "threshold is how far that engine's own verify of their turns is from our reference (a turn within "
                 "it: ties), or, unscored, its baseline's largest margin")


def judged(results: Results, group: RunGroup) -> pd.DataFrame:
    """A group's prompt rows with each replayed turn's numeric ties as `replay_split` counts them."""
    p = replayed(group.prompts)
    if p.empty:
        return group.prompts
    ties, _ = replay_split(results, group, p)
    return group.prompts.assign(replay_ties=ties.reindex(group.prompts.index).fillna(group.prompts.replay_ties))


def replay_split(results: Results, group: RunGroup, p: pd.DataFrame) -> tuple[pd.Series, str]:
    """Per replayed turn, how many of its off tokens are numeric ties, and the threshold that said so. Our
    engine's: the replay's own count, against the dtype's threshold. Another engine's: its baseline cannot have a
    lossless bug (it does not speculate), so every off token is that engine's numerics against ours; a run of
    that engine that speculates has a turn's off tokens called ties where the turn's largest margin is within
    that engine's measured error: the largest, over the run's turns, of how far its own verify of each turn
    (scored after the run) is from our reference (`greedy_replay.engine_error`); where the run was not scored,
    what the engine's own baseline showed on these prompts; the replay's own count elsewhere."""
    engine = group.info["settings"].get("engine", BEFORE["engine"])
    if engine == BEFORE["engine"]:
        return p.replay_ties, "the dtype's"
    if group.method == "baseline":
        return p.replay_off, f"none: {engine}'s baseline does not speculate"
    error = engine_error(p)
    if error == error:  # measured (not NaN)
        return (p.replay_off.where(p.replay_margin <= error, p.replay_ties),
                f"{engine}'s verify against ours on these turns, {error:.3g} logits")
    base = results.baseline_for(group)
    measured = replayed(base.prompts) if base is not None else p.iloc[:0]
    if measured.empty:
        return p.replay_ties, f"the dtype's ({engine}'s numerics unmeasured: no {engine} baseline replayed)"
    gap = float(measured.replay_margin.max()) if (measured.replay_off > 0).any() else 0.0
    return p.replay_off.where(p.replay_margin <= gap, p.replay_ties), f"{engine} baseline's {gap:.3g} logits"


def _exact_pair(ours: dict, baseline: dict) -> bool:
    """Both runs batch-invariant in the same dtype: their greedy outputs must be equal bit for bit."""
    return bool(ours.get("batch_invariant") and baseline.get("batch_invariant")) and ours.get("dtype") == baseline.get("dtype")


def oracle_tables(results: Results) -> list[Table]:
    """Static drafters and Oracle-Task/Prompt/Token τ per subtask (or category), one table per oracle run."""
    tables = []
    for run in results.oracles:
        paths = oracle.paths(run.replay)
        by = "subtask" if paths.subtask.nunique() > 1 else "category"
        wide = oracle.summary(paths, by).pivot(index="path", columns=by, values="tau")
        order = [*sorted(set(wide.index) - set(oracle.ORACLES)), *oracle.ORACLES]
        cols = [c for c in wide.columns if c != "overall"] + ["overall"]
        frame = wide.loc[order, cols].reset_index()
        s = run.info.get("settings", {})
        tables.append(Table(f"oracle_{run.dir.name}", f"Oracle τ by trace replay: {s.get('model', '?')} · "
                            f"{s.get('dataset', '?')}", frame, "Oracle-Token: fewest rounds over per-round choices"))
    return tables


def calibration_tables(results: Results) -> list[Table]:
    """Each calibration's threshold sweep (WhiFlash Table 2): simulated tokens/s, τ and EAGLE-3 share."""
    tables = []
    for cal in results.calibrations:
        method, model = cal.card.get("method", "?"), cal.card.get("model", "?")
        tables.append(Table(f"calibration_{method}_{model}", f"{method} · {model}: threshold sweep (chosen: "
                            f"{cal.card.get('threshold', float('nan')):.3f})", cal.sweep,
                            "simulated from trace replay and latencies measured at calibration"))
    return tables


def phases(results: Results) -> Table:
    rows = []
    for g in results.groups:
        if g.rounds.verify_ms.notna().any():
            means = split(g.rounds).mean()
            rows.append({"dataset": g.info["settings"]["dataset"], "method": g.label,
                         **{f"{p} ms": means[p] for p in PARTS}, "round ms": means["round"]})
    clocks = sorted({g.info.get("clock", "?") for g in results.groups})
    return Table("phases", f"Mean ms per round by phase (clock: {', '.join(clocks)})", pd.DataFrame(rows),
                 "host = round wall time minus the timed phases")


def drafting_by_context(results: Results) -> Table:
    """Each drafting method's median draft ms a round per 128-token bin of the cached context (`phases.draft_by_context`)."""
    rows = []
    for g in results.groups:
        if g.rounds.draft_ms.notna().any() and g.rounds.tree_size.gt(0).any():
            by_bin = draft_by_context(g.rounds)
            spread = by_bin.pop("spread", float("nan"))
            rows.append({"dataset": g.info["settings"]["dataset"], "method": g.label,
                         **{f"{start}+": ms for start, ms in sorted(by_bin.items())}, "largest/smallest": spread})
    frame = pd.DataFrame(rows)
    if len(frame):  # bin columns in context order whatever the methods reached
        bins = sorted((c for c in frame.columns if c.endswith("+")), key=lambda c: int(c[:-1]))
        frame = frame[["dataset", "method", *bins, "largest/smallest"]]
    return Table("drafting_by_context", f"Median draft ms a round by cached context ({CONTEXT_BIN}-token bins, "
                 f"from the token named)", frame, f"bins of fewer than {MIN_BIN_ROUNDS} rounds left blank; "
                 "largest/smallest: the bins' largest median over their smallest")


def environment(results: Results) -> Table:
    """What each run measured on (from run.json): hardware, threads, clock, memory, energy, versions."""
    rows = []
    for g in results.groups:
        env, info = g.info.get("environment", {}), g.info
        rows.append({"method": g.label, "dataset": info["settings"]["dataset"], "dirs": len(g.dirs),
                     "device": env.get("device", "?"), "hardware": g.hardware, "threads": env.get("torch_threads", "?"),
                     "clock": info.get("clock", "?"), "peak RSS MB": info.get("peak_rss_mb", NAN),
                     "CUDA peak alloc MB": info.get("cuda_max_allocated_mb", NAN),
                     "J/token": info.get("energy_per_token_j", NAN), "torch": env.get("torch", "?"),
                     "commit": (env.get("git_commit") or "?")[:10], "options": _options(info)})
    return Table("environment", "Where and how each run was measured", pd.DataFrame(rows))


def _options(info: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in info["settings"].get("options", {}).items()) or "—"


def along(results: Results, dataset: str, bin_tokens: int = 16) -> Table:
    """The numbers of the `tau_along_response` figure for every drafting method of a dataset: per bin of the
    response, the mean over turns of tokens per round and the turns that reach the bin (files only)."""
    rows: dict[int, dict] = {}
    for g in in_dataset(results, dataset):
        if not g.rounds.tree_size.gt(0).any():
            continue  # the baseline emits one token a round everywhere
        for position, r in along_response(g.rounds, bin_tokens).iterrows():
            row = rows.setdefault(int(position), {"from token": int(position)})
            row[f"{g.label} tokens/round"], row[f"{g.label} turns"] = r["mean"], int(r["n"])
    frame = pd.DataFrame([rows[k] for k in sorted(rows)])
    return Table(f"tau_along_response_{dataset_slug(dataset)}", f"Acceptance along the response ({dataset}): tokens "
                 f"per round by position in the response, {bin_tokens}-token bins", frame,
                 "mean over turns of each turn's tokens per round (accepted + 1) in the bin that starts at that token "
                 "of the response; bins fewer than a quarter of a method's turns reach are left blank", terminal=False)


def all_tables(results: Results, classify: Classifier | None = None) -> list[Table]:
    tables = [overview(results)]
    for ds in datasets(results):
        groups = in_dataset(results, ds)
        prompts = pd.concat([g.prompts for g in groups])
        if prompts.subtask.nunique() > 1:
            tables.append(by_group(results, ds, "subtask"))
        if prompts.category.nunique() > 1:
            tables.append(by_group(results, ds, "category"))
            tables[-1].terminal = prompts.subtask.nunique() == 1
        tables.append(group_intervals(results, ds, group_column(prompts)))
        tables.append(along(results, ds))
    wide = [positions(results), lengths(results), phases(results), drafting_by_context(results),
            environment(results)]  # files only: too wide
    for table in wide:
        table.terminal = False
    tables += [*scaling.tables(results), cross_engine.table(results), routing(results), hybrid(results), lossless(results, classify), replay(results),
               *oracle_tables(results),
               *calibration_tables(results), *wide]
    return [t for t in tables if len(t.frame)]


# ---------------------------------------------------------------------------------------------- figures
def figures(results: Results, folder, along: list[str] | None = None) -> list:
    """Speedup/τ per category for each dataset, τ along the response for two methods (`along`, default the
    first two drafting methods), phase breakdown and acceptance survival for every method."""
    from specbench_cli.analysis import plots

    written = []
    many = len(datasets(results)) > 1
    name = (lambda g: f"{g.label} · {g.info['settings']['dataset']}") if many else (lambda g: g.label)
    for ds in datasets(results):
        groups = in_dataset(results, ds)
        by = group_column(pd.concat([g.prompts for g in groups]))
        rows = {g.label: summarise(g.prompts, by, _speedup_source(results, g)[0]) for g in groups}
        written += plots.save(plots.per_category(rows, by, ds), folder,
                              f"per_{by}_{dataset_slug(ds)}")
        drafting = [g for g in groups if g.rounds.tree_size.gt(0).any()]
        pair = [g for g in groups if g.label in along] if along else drafting[:2]
        if pair:
            fig = plots.tau_along_response({g.label: g.rounds for g in pair})
            written += plots.save(fig, folder, f"tau_along_response_{dataset_slug(ds)}")
    withrounds = [g for g in results.groups if g.rounds.verify_ms.notna().any()]  # not methods owning their loop
    if withrounds:
        clocks = ", ".join(sorted({g.info.get("clock", "?") for g in withrounds}))
        written += plots.save(plots.phase_bars({name(g): g.rounds for g in withrounds}, clocks), folder, "phases")
        drafting = [g for g in withrounds if g.rounds.tree_size.gt(0).any()]
        if drafting:
            written += plots.save(plots.survival_curves({name(g): g.rounds for g in drafting}), folder, "survival")
            written += plots.save(plots.length_histogram({name(g): g.rounds for g in drafting}), folder,
                                  "acceptance_histogram")
    for load, unit in scaling.LOADS.items():
        if scaling.swept(results, load):
            written += plots.save(plots.against_load(scaling.figure_series(results, load), load, unit,
                                                     scaling.context(results)), folder, f"throughput_vs_{load}")
    for cal in results.calibrations:
        written += plots.save(plots.threshold_sensitivity(cal.sweep, cal.card.get("method", "")), folder,
                              f"sensitivity_{cal.card.get('method')}_{cal.card.get('model')}")
    return written
