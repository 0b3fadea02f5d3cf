"""`specbench run --method a,b,c --repeat N`: several methods measured side by side on one loaded target.

Every prompt is decoded by each method in turn, the order rotated one place per prompt, and the selection is
taken N times, so that the machine's drift (it can move tens of percent within minutes) touches every method
alike and `report` can pair the measurements (`analysis/intervals.py`). Each method writes its own results
folder, `<out>/<method>` (an A/A pair `baseline,baseline` writes `baseline` and `baseline-2`), exactly as a run
of that method alone would, plus run.json's `pairing` (the list's id and members) and a `repeat` column; resume,
report and shards read them as any run.

With `--engine vllm` each method runs in an engine of its own (a vLLM engine serves one speculative config),
all of them started side by side before the first prompt and alive together (about 2.5 GB each for the
embedded model in float32 on the CPU), and every prompt goes to each engine in turn the same way; a new pass empties each engine's suffix and
prefix caches (the worker's "forget").

What a list refuses, in one line before anything loads: a method twice (but baseline, for the A/A run), an
`--opt` that does not name its method (`--opt eagle3.depth=4`), --batch-size or --concurrency above 1 (a list
decodes one sequence at a time), and --engine-url/--engine-serve (a server runs one method; see docs/measuring.md's
"Paired runs").
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console

from specbench_cli.core.errors import UsageError, unknown
from specbench_cli.datasets import parse_shard
from specbench_cli.inputs import Plan, RunConfig, acceptance_for, at_least, check_run, default_name
from specbench_cli.registry import METHODS, engine_entry, method_class

AA = "baseline"  # the one method a list may name twice: baseline,baseline measures the machine's noise
MAX_PASSES = 1000  # --repeat: far past where intervals stop narrowing usefully; a larger number is a typo


def parse_methods(text: str) -> list[str]:
    """--method as a list: known names, none twice but baseline (at most twice)."""
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise UsageError(f"--method '{text}': an empty name in the list")
    for name in names:
        if name not in METHODS:
            raise unknown("method", name, METHODS)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice and (twice != [AA] or names.count(AA) > 2):
        raise UsageError(f"--method '{text}' names {', '.join(twice)} more than once; only {AA} may appear twice "
                         f"({AA},{AA}: the A/A run that measures the machine's noise)")
    return names


def member_names(methods: list[str]) -> list[str]:
    """Each member's folder name: its method, the second of an A/A pair `baseline-2`."""
    return [m if methods[:i].count(m) == 0 else f"{m}-{methods[:i].count(m) + 1}" for i, m in enumerate(methods)]


def member_opts(opts: list[str], methods: list[str]) -> dict[str, list[str]]:
    """In a list every --opt starts with the method it is for (`eagle3.depth=4`, a routed method's inner drafter
    `whiflash-entropy.eagle3.depth=4`); each method gets its own with that name taken off."""
    mine: dict[str, list[str]] = {m: [] for m in methods}
    for opt in opts:
        head, dot, rest = opt.partition(".")
        if dot and head in METHODS and head not in mine:
            raise UsageError(f"--opt {opt}: {head} is not in the list ({', '.join(dict.fromkeys(methods))})")
        if not dot or head not in mine or "=" not in rest:
            raise UsageError(f"--opt {opt}: with several methods each --opt names its method first, e.g. "
                             f"--opt {next((m for m in methods if m != AA), methods[0])}.KEY=VALUE")
        mine[head].append(rest)
    return mine


def member_configs(config: RunConfig, batch_size: str, concurrency: str) -> list[RunConfig]:
    """The run of each method of the list, into `<out>/<member>`; everything a list refuses is refused here."""
    methods = parse_methods(config.method)
    at_least("--repeat", config.repeat, 1)
    if config.repeat > MAX_PASSES:
        raise UsageError(f"--repeat {config.repeat}: at most {MAX_PASSES} passes (each pass decodes the whole "
                         "selection once more)")
    if config.engine_url or config.engine_serve:
        raise UsageError("a vLLM server runs one method: a comma list of methods and --repeat start an engine of "
                         "their own per method (drop --engine-url/--engine-serve)")
    if batch_size.strip() != "1" or concurrency.strip() != "1":
        raise UsageError("a comma list of methods and --repeat run one sequence at a time; run each --batch-size "
                         "or --concurrency level on its own")
    if config.device == "split":
        raise UsageError("--device split is for acceptance studies of one method; a list of methods times them")
    root = config.out or config.results_root / default_name(
        dataclasses.replace(config, method="+".join(dict.fromkeys(methods))), parse_shard(config.shard, dict(os.environ)))
    if len(methods) == 1:  # --repeat alone: the run's own folder
        return [dataclasses.replace(config, out=root)]
    opts, drafters = member_opts(config.opts, methods), member_drafters(config.drafters, methods)
    return [dataclasses.replace(config, method=m, opts=opts[m], drafters=drafters[m], out=root / name,
                                acceptance=member_acceptance(config.acceptance, m, methods))
            for m, name in zip(methods, member_names(methods))]


def member_acceptance(entries: list[str], method: str, methods: list[str]) -> list[str]:
    """A member's --acceptance (a baseline in the list stays the target's own decoding: `acceptance_for`)."""
    spec = acceptance_for(entries, method, methods, method_class(method).drafts)
    return [spec] if spec else []


def member_drafters(pairs: list[str], methods: list[str]) -> dict[str, list[str]]:
    """Each --drafter NAME=PATH goes to the methods that take a drafter of that name; one that none takes is
    refused."""
    takes = {m: {*method_class(m).drafter_names, *method_class(m).optional_drafters} for m in methods}
    mine: dict[str, list[str]] = {m: [] for m in methods}
    for pair in pairs:
        users = [m for m in methods if pair.partition("=")[0] in takes[m]]
        if not users:
            raise UsageError(f"--drafter {pair}: none of {', '.join(dict.fromkeys(methods))} takes a drafter named "
                             f"'{pair.partition('=')[0]}'")
        for m in users:
            mine[m].append(pair)
    return mine


def run_list(config: RunConfig, batch_size: str, concurrency: str, threads: int | None, console: Console) -> Path:
    """Check every member, plan them, load the target once and record them interleaved."""
    from specbench_cli.inputs import use_threads

    at_least("--threads", threads, 1)
    configs = member_configs(config, batch_size, concurrency)
    env = dict(os.environ)
    checked = [check_run(c, env) for c in configs]
    from specbench_cli.planning import loaded_target, one_weight_copy, plan

    use_threads(threads)
    plans = [plan(c, env, chosen) for c, chosen in zip(configs, checked)]
    _same_target(plans)
    for line in dict.fromkeys(line for p in plans for line in p.notes):
        console.print(line, highlight=False, soft_wrap=True)
    ours = engine_entry(config.engine).our_target  # a production engine loads its own target
    model = loaded_target(plans[0], None, False) if ours else None
    if model is not None:
        model.one_copy = one_weight_copy(plans)
    record_plans(plans, model, config.repeat, console)
    root = plans[0].out.parent if len(plans) > 1 else plans[0].out
    _print_overview(root, console)
    return root


def record_plans(plans: list[Plan], model, passes: int, console: Console) -> None:
    """Record planned runs interleaved (`run_folder.record_interleaved`), our engine's on one loaded target
    (`model`), vLLM's each in its engine; each folder is resumed where its plan says so. Also what `tune`'s live
    check runs."""
    from specbench_cli.records import RUN_TABLES
    from specbench_cli.run_folder import RunFolder, record_interleaved

    entries = [engine_entry(p.config.engine) for p in plans]
    plans = share_the_device(plans, entries)
    members = [(RunFolder(p.out, RUN_TABLES), entry.make_job(p, console, model if entry.our_target else None),
                p.config.resume) for p, entry in zip(plans, entries)]  # a production engine loads its own target
    sharing = [job for (_, job, _), entry in zip(members, entries) if entry.our_target and model is not None]
    for job in sharing[1:]:
        job.announce_dtype = False  # they share the first one's target: one line says its dtype
    pairing = {"id": secrets.token_hex(6), "members": [p.out.name for p in plans], "passes": passes}
    with ExitStack() as claimed:
        for (folder, _, resume) in members:  # each folder owned for the run (`RunFolder.session`), released in reverse
            claimed.enter_context(folder.session(resume, lambda line: console.print(line, highlight=False)))
        record_interleaved(members, plans[0].prompts, plans[0].warmup, passes, console,
                           f"{'+'.join(p.out.name for p in plans)} on {plans[0].config.dataset}", pairing)


def share_the_device(plans: list[Plan], entries) -> list[Plan]:
    """The engines of a list run side by side, each with its share of one GPU's memory (`EnginePlan.share`, which
    the engine's launch turns into vLLM's gpu_memory_utilization and run.json records), so that together they
    take what one engine would."""
    engines = [i for i, entry in enumerate(entries) if not entry.our_target and plans[i].engine is not None]
    if len(engines) < 2:
        return plans
    return [dataclasses.replace(p, engine=dataclasses.replace(p.engine, share=1 / len(engines))) if i in engines else p
            for i, p in enumerate(plans)]


def _same_target(plans: list[Plan]) -> None:
    """Every member decodes with the one loaded target: the same dtype, device and batch invariance."""
    first = plans[0]
    for p in plans[1:]:
        mine = (p.dtype, p.device, p.batch_invariant, p.compile_mode)
        if mine != (first.dtype, first.device, first.batch_invariant, first.compile_mode):
            raise UsageError(f"{p.config.method} would run its target as {mine[0]} on {mine[1]} (invariant "
                             f"{mine[2]}), {first.config.method} as {first.dtype} on {first.device} (invariant "
                             f"{first.batch_invariant}); pass --dtype and --batch-invariant so they share one")


def _print_overview(root: Path, console: Console) -> None:
    """The members side by side: τ, tokens/s and speedup with their intervals, and the noise line."""
    from specbench_cli.analysis.report import overview
    from specbench_cli.analysis.results import load
    from specbench_cli.analysis.summary import replay_line

    results = load([root])
    table = overview(results)
    table.write(root)
    brief = table.frame[["method", "prompts", "passes", "τ", "tokens/s", "tokens/s 95% CI", "speedup", "speedup 95% CI"]]
    console.print(dataclasses.replace(table, frame=brief).rich())
    for group in results.groups:
        line = replay_line(group.prompts, group.info)
        if line:
            console.print(f"{group.label}: {line}", highlight=False, soft_wrap=True)
    console.print(f"results in {root} (a folder per method of a list, paired); the full report: specbench report "
                  f"{root}", highlight=False, soft_wrap=True)
