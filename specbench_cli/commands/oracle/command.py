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
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from rich.console import Console

from specbench_cli.core.method import Method, OwnLoop, Router
from specbench_cli.options import options_record, parse_options
from specbench_cli.core.errors import UsageError
from specbench_cli.datasets import dataset_slug
from specbench_cli.models import checkpoint_ref
from specbench_cli.commands.oracle.replay import Trace, replay_turn
from specbench_cli.inputs import Plan, RunConfig
from specbench_cli.loading import target_weights
from specbench_cli.planning import drafter_ref, drafter_weights, loaded_target, plan
from specbench_cli.registry import method_class
from specbench_cli.run_folder import OneAtATime, RunFolder, RunInfo, Start, new_session, record
from specbench_cli.engines.specbench import Runner

NOT_REPLAYABLE = {"confu": "its future token comes from the target's verify pass, which replay does not run",
                  "hf-generate": "it runs its own loop", "baseline": "it drafts nothing"}


@dataclass
class OracleConfig:
    drafters: list[str]
    run: RunConfig  # model, dataset, selection, max_new_tokens, warmup, target, --drafter checkpoints
    opts: list[str] = field(default_factory=list)  # "METHOD.key=value"
    # time each of a drafter's round starts right after a forward of the target, as a live round drafts (`tune`
    # prices drafts by these times; replay_turn)
    cold_drafts: bool = False


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
        if name in NOT_REPLAYABLE or issubclass(cls, (OwnLoop, Router)):
            raise UsageError(f"{name} cannot be replayed: {NOT_REPLAYABLE.get(name, 'it is not a single drafter')}")
        options[name] = parse_options(cls, opts)
        classes.append(cls)
    run = dataclasses.replace(config.run, method="baseline", drafters=[], out=config.run.out or Path("results") / (
        f"oracle_{config.run.model}_{dataset_slug(config.run.dataset)}"))
    checked = plan(run, dict(os.environ), cpu_bf16=False)  # replay = live is exact in float32
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


ORACLE_TABLES = ("replay", "signals", "drafts", "traces")  # traces last: it marks a prompt finished


def run_oracle(config: OracleConfig, console: Console, model=None) -> Path:
    """Record the oracle directory (`model`: an already loaded target of the run's model, device and dtype)."""
    checked, options = check(config)
    folder = RunFolder(checked.out, ORACLE_TABLES)
    job = OracleJob(config, checked, options, console, model)
    with folder.session(config.run.resume, lambda line: console.print(line, highlight=False)):
        record(folder, job, checked.prompts, checked.warmup, config.run.resume, console, job.label)
    return checked.out


class OracleJob(OneAtATime):
    """`oracle`'s rows: a prompt's greedy traces, and what every drafter would have had accepted along them."""

    def __init__(self, config: OracleConfig, checked: Plan, options: dict[str, object], console: Console,
                 model=None) -> None:
        self.config, self.checked, self.options, self.given = config, checked, options, model
        self.label = f"oracle replay of {', '.join(options)}"

    def begin(self) -> Start:
        settings = {**self.checked.settings(), "method": "oracle", "drafters": self.config.drafters,
                    "opts": self.config.opts, "options": {n: options_record(o) for n, o in self.options.items()},
                    "cold_drafts": self.config.cold_drafts}
        # the weights replayed: every drafter's and the target's (a moved hub repo is another oracle), recorded and
        # checked on --resume as a run's are
        self.weights = {name: weights for n, o in self.options.items() for name, weights in drafter_weights(
            dataclasses.replace(self.checked, method_cls=method_class(n), options=o)).items()}
        self.target_weights = target_weights(self.checked.spec)
        # replay measures no time: a resume on another machine or thread count makes the same records
        return Start(settings, new_session(self.checked.device), kind="oracle", measured=(), weights=self.weights,
                     target=self.target_weights)

    def prepare(self) -> dict:
        self.runner = Runner(self.checked, loaded_target(self.checked, self.given))  # baseline decoding: the traces
        self.longest = self.runner.check_lengths()
        self.drafters: dict[str, Method] = {n: method_class(n)(o, self.runner.model, self.checked.drafters)
                                            for n, o in self.options.items()}
        return {"dtype_choice": self.checked.dtype_reason, "drafter_weights": self.weights,
                "target_weights": self.target_weights}

    @contextmanager
    def running(self, info: RunInfo, save: Callable[[], None]) -> Iterator[None]:
        if self.checked.compile_mode is not None:
            info.more["compile"] = self.runner.compile(self.longest, tuple(self.drafters.values()))
            save()
        yield

    def warm_up(self, prompt) -> None:
        self._replay(prompt)  # cross-prompt state (suffix cache) sees them, as in a live run

    def absorb(self, output_ids: list[int]) -> None:
        for d in self.drafters.values():
            d.absorb(output_ids)

    def decode(self, index: int, prompt) -> dict[str, pa.Table]:
        return _parts(index, *self._replay(prompt))

    def stats(self) -> str:
        return ""

    def replayed(self) -> list[tuple[int, dict]]:
        return []  # traces are greedy decodes of their own: nothing to check after

    def facts(self, info: RunInfo) -> dict:
        return {}

    def _replay(self, prompt) -> tuple[list[Trace], list]:
        traces = [Trace(prompt.id, t, prompt.category, prompt.subtask, ids, r.output_ids)
                  for t, (ids, r) in enumerate(self.runner.decode_prompt(prompt))]
        return traces, [replay_turn(self.runner.target, self.drafters, tr, self.config.cold_drafts) for tr in traces]


def _typed(info: dict) -> dict:
    """Token lists as int64 arrays: an all-empty list column would be written as list<null>, a schema the
    other parts' list<int64> does not match when the directory is read back."""
    return {k: np.asarray(v, dtype=np.int64) if isinstance(v, list) else v for k, v in info.items()}


def _parts(index: int, traces: list[Trace], turns: list) -> dict[str, pa.Table]:
    replay, signals, drafts = [], [], []
    for tr, r in zip(traces, turns):
        ident = dict(prompt_id=tr.prompt_id, turn=tr.turn, category=tr.category, subtask=tr.subtask)
        for name, w in r.walks.items():
            replay += [dict(ident, position=t, drafter=name, accepted=a, drafted=n, branched=b, draft_ms=ms)
                       for t, (a, n, b, ms) in enumerate(zip(w.accepted, w.drafted, w.branched, w.draft_ms))]
            drafts += [dict(ident, position=t, drafter=name, prompt_len=len(tr.prompt_ids), **_typed(info))
                       for t, info in enumerate(w.infos)]
        signals += [dict(ident, position=t, entropy=float(e), hidden=h.tolist()) for t, (e, h) in
                    enumerate(zip(r.entropy, r.hidden))]
    parts = {"replay": pd.DataFrame(replay), "signals": pd.DataFrame(signals), **({"drafts": pd.DataFrame(drafts)} if drafts else {}),
             "traces": pd.DataFrame([dict(index=index, prompt_id=tr.prompt_id, turn=tr.turn, output_ids=tr.output_ids)
                                     for tr in traces])}
    return {name: pa.Table.from_pandas(frame, preserve_index=False) for name, frame in parts.items()}
