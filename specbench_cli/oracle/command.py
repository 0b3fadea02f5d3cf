"""`specbench oracle`: greedy traces of a dataset, replayed for every drafter, into an oracle directory.

    <out>/run.json          kind "oracle", settings, environment, status
    <out>/replay.parquet/   one part per prompt: (prompt_id, turn, category, subtask, position, drafter, accepted)
    <out>/signals.parquet/  one part per prompt: (prompt_id, turn, position, entropy, hidden) — router inputs
    <out>/traces.parquet/   one part per prompt: the greedy output ids per turn (resume replays them)
    <out>/drafts.parquet/   one part per prompt, for drafters that describe their drafts (suffix: score, matched
                            length, draft tokens; HVD's payoff predictor trains on them)

`report` turns replay.parquet into static / Oracle-Task / Oracle-Prompt / Oracle-Token rows; `calibrate`
reads replay and signals. Like `run`, prompts are written as they finish and `--resume` continues.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console

from specbench_cli.core.method import Method, drafter_ref, parse_options
from specbench_cli import hardware
from specbench_cli.core.errors import UsageError
from specbench_cli.datasets import dataset_slug
from specbench_cli.folders import claim, write_atomically
from specbench_cli.models import checkpoint_ref
from specbench_cli.oracle.replay import Trace, replay_turn
from specbench_cli.inputs import RunConfig
from specbench_cli.registry import method_class
from specbench_cli.runner import Plan, Runner, plan, progress_bar

NOT_REPLAYABLE = {"confu": "its future token comes from the target's verify pass, which replay does not run",
                  "hf-generate": "it runs its own loop", "baseline": "it drafts nothing"}


@dataclass
class OracleConfig:
    drafters: list[str]
    run: RunConfig  # model, dataset, selection, max_new_tokens, warmup, target, --drafter checkpoints
    opts: list[str] = field(default_factory=list)  # "METHOD.key=value"


def drafter_options(names: list[str], opts: list[str]) -> dict[str, list[str]]:
    per: dict[str, list[str]] = {n: [] for n in names}
    for opt in opts:
        name, dot, rest = opt.partition(".")
        if not dot or name not in per:
            raise UsageError(f"malformed --opt '{opt}': expected DRAFTER.key=value with DRAFTER one of {', '.join(names)}")
        per[name].append(rest)
    return per


def check(config: OracleConfig) -> tuple[Plan, dict[str, object]]:
    """Everything that can be checked before a model loads: drafters, their options, the selection."""
    if not config.drafters:
        raise UsageError("--drafters needs at least one method, e.g. eagle3,dflash")
    options, classes = {}, []
    for name, opts in drafter_options(config.drafters, config.opts).items():
        cls = method_class(name)
        if name in NOT_REPLAYABLE or cls.owns_loop or cls.routed:
            raise UsageError(f"{name} cannot be replayed: {NOT_REPLAYABLE.get(name, 'it is not a single drafter')}")
        options[name] = parse_options(cls, opts)
        classes.append(cls)
    run = dataclasses.replace(config.run, method="baseline", drafters=[], out=config.run.out or Path("results") / (
        f"oracle_{config.run.model}_{dataset_slug(config.run.dataset)}"))
    checked = plan(run, dict(os.environ))
    checked.drafters = checkpoint_refs(config.run.drafters, classes)
    for cls in classes:
        for name in cls.drafter_names:
            drafter_ref(cls, checked.spec, checked.drafters, name)  # a missing drafter fails before loading
    return checked, options


def checkpoint_refs(pairs: list[str], classes: list[type]) -> dict[str, str]:
    """--drafter NAME=PATH pairs, NAME being a checkpoint one of the replayed drafters reads."""
    accepted = {n for cls in classes for n in (*cls.drafter_names, *cls.optional_drafters)}
    refs = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or name not in accepted:
            raise UsageError(f"bad --drafter '{pair}': expected NAME=PATH with NAME one of {', '.join(sorted(accepted))}")
        refs[name] = checkpoint_ref(path, "drafter")
    return refs


def execute(config: OracleConfig, console: Console) -> Path:
    checked, options = check(config)
    with claim(checked.out, config.run.resume, lambda line: console.print(line, highlight=False)):
        _record(config, checked, options, console)
    return checked.out


def _record(config: OracleConfig, checked: Plan, options: dict[str, object], console: Console) -> None:
    from specbench_cli.loading import load_model

    out = checked.out
    model = load_model(checked.spec, checked.device, checked.dtype)
    runner = Runner(checked, model)  # baseline decoding gives the traces
    longest = runner.check_lengths()
    drafters: dict[str, Method] = {n: method_class(n)(o, model, checked.drafters) for n, o in options.items()}
    done = _start(out, checked, config, drafters)
    if checked.compile_mode is not None:
        compiled = runner.compile(longest, tuple(drafters.values()))
        info = json.loads((out / "run.json").read_text())
        (out / "run.json").write_text(json.dumps({**info, "compile": compiled}, indent=2))
    for prompt in checked.warmup:  # cross-prompt state (suffix cache) sees them, as in a live run
        _replay_prompt(runner, drafters, prompt)
    with progress_bar(console) as bar:
        task = bar.add_task(f"oracle replay of {', '.join(drafters)}", total=len(checked.prompts),
                            completed=len(done), stats="")
        for index, prompt in enumerate(checked.prompts):
            if index in done:
                continue
            traces, turns = _replay_prompt(runner, drafters, prompt)
            _write_prompt(out, index, traces, turns)
            bar.update(task, advance=1)
    info = json.loads((out / "run.json").read_text())
    info.update(status="complete", finished=dt.datetime.now().isoformat(timespec="seconds"))
    (out / "run.json").write_text(json.dumps(info, indent=2, default=str))


def _start(out: Path, checked: Plan, config: OracleConfig, drafters: dict[str, Method]) -> set[int]:
    """Create the oracle directory, or on --resume replay finished prompts' traces into the drafters."""
    settings = {**checked.settings(), "method": "oracle", "drafters": config.drafters, "opts": config.opts,
                "options": {n: dataclasses.asdict(d.options) for n, d in drafters.items()}}
    done: set[int] = set()
    if config.run.resume:
        previous = json.loads((out / "run.json").read_text())["settings"]
        if previous != json.loads(json.dumps(settings, default=str)):
            raise UsageError(f"--resume: {out} was made with different settings")
        traces = pd.read_parquet(out / "traces.parquet") if (out / "traces.parquet").exists() else None
        if traces is not None:
            done = set(traces["index"])
            for ids in traces.sort_values(["index", "turn"]).output_ids:
                for d in drafters.values():
                    d.absorb([int(t) for t in ids])
    else:
        for folder in ("replay.parquet", "signals.parquet", "traces.parquet", "drafts.parquet"):
            (out / folder).mkdir(parents=True)
    info = {"kind": "oracle", "settings": settings, "environment": hardware.environment(checked.device),
            "started": dt.datetime.now().isoformat(timespec="seconds"), "status": "running"}
    (out / "run.json").write_text(json.dumps(info, indent=2, default=str))
    return done


def _replay_prompt(runner: Runner, drafters: dict[str, Method], prompt) -> tuple[list[Trace], list]:
    traces = [Trace(prompt.id, t, prompt.category, prompt.subtask, ids, r.output_ids)
              for t, (ids, r) in enumerate(runner.decode_prompt(prompt))]
    return traces, [replay_turn(runner.target, drafters, tr) for tr in traces]


def _typed(info: dict) -> dict:
    """Token lists as int64 arrays: an all-empty list column would be written as list<null>, a schema the
    other parts' list<int64> does not match when the directory is read back."""
    return {k: np.asarray(v, dtype=np.int64) if isinstance(v, list) else v for k, v in info.items()}


def _write_prompt(out: Path, index: int, traces: list[Trace], turns: list) -> None:
    replay, signals, drafts = [], [], []
    for tr, r in zip(traces, turns):
        ident = dict(prompt_id=tr.prompt_id, turn=tr.turn, category=tr.category, subtask=tr.subtask)
        for name, als in r.accepted.items():
            replay += [dict(ident, position=t, drafter=name, accepted=a) for t, a in enumerate(als)]
        for name, infos in r.drafts.items():
            drafts += [dict(ident, position=t, drafter=name, prompt_len=len(tr.prompt_ids), **_typed(info))
                       for t, info in enumerate(infos)]
        signals += [dict(ident, position=t, entropy=float(e), hidden=h.tolist()) for t, (e, h) in
                    enumerate(zip(r.entropy, r.hidden))]
    parts = {"replay": pd.DataFrame(replay), "signals": pd.DataFrame(signals), **({"drafts": pd.DataFrame(drafts)} if drafts else {}),
             "traces": pd.DataFrame([dict(index=index, prompt_id=tr.prompt_id, turn=tr.turn, output_ids=tr.output_ids)
                                     for tr in traces])}
    for name, frame in parts.items():  # traces last: a prompt counts as finished when its trace part exists
        write_atomically(out / f"{name}.parquet" / f"part-{index:05d}.parquet", frame.to_parquet)
