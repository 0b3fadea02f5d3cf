"""The life of a results folder, the same for every kind of run that writes one: `run` at any batch size,
`run --engine vllm`, `oracle` (and the runs `tune` and `calibrate` make of them). A kind of run is a `PromptJob`;
`record` is the one driver that runs any job over a `RunFolder`:

    claim (one writer: folders.claim) -> resume check (settings, weights, machine) -> prepare (load; the
    prompts fit) -> start (run.json "running", a new session) -> compile or start the engine -> warm-up ->
    finished prompts absorbed (resume) -> one atomic part per finished prompt in each table -> end:
    "complete", "interrupted" (Ctrl-C, SIGTERM) or "failed" (a write that failed: disk full, permission, a
    vanished folder; an engine that died)

run.json is a `RunInfo`: the fields every kind of run has, and a kind's own keys beside them (`more`), all at
the top level of the file. Parts are written to a hidden name and renamed, table by table in the order the
kind declares, so the last table's part is the mark of a finished prompt; `finished` clears the rest of an
unfinished one. A resumed run replays the finished prompts' outputs (`finished_outputs`) into the method's
cross-prompt state before it decodes the others.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from rich.console import Console

from specbench_cli import hardware
from specbench_cli.core.errors import UsageError
from specbench_cli.datasets import Prompt
from specbench_cli.folders import claim, write_atomically
from specbench_cli.progress import record_progress

# What a setting meant in runs written before it existed (a resume compares it as this).
LEGACY_SETTINGS = {"compile": None, "batch_invariant": False, "prepacked": False, "repeat": 1, "batch_size": 1,
                   "cold_drafts": False}
# Environment facts that change what a timing means: a resume of a timed run must keep them.
MEASURED = ("device", "cpu", "gpu", "torch_threads")


def now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


class Terminated(KeyboardInterrupt):
    """SIGTERM (what Slurm sends at a time limit or on preemption), handled as Ctrl-C is."""


class RunFailed(UsageError):
    """The run cannot go on (the message says why); the session ends "failed" with every finished prompt kept."""


class WriteFailed(RunFailed):
    """A record could not be written (the message names the path and the cause)."""


@dataclass
class RunInfo:
    """run.json. `more`: the keys a kind of run adds (clock, compile facts, weights...), written beside these."""

    settings: dict
    started: str
    environment: dict  # the first session's machine (each session's is in `sessions`)
    kind: str = "run"
    status: str = "running"  # running | complete | interrupted | failed
    sessions: list[dict] = field(default_factory=list)
    finished: str | None = None
    reason: str | None = None  # why the last session did not complete
    more: dict = field(default_factory=dict)

    FIELDS = ("kind", "settings", "started", "environment", "status", "sessions", "finished", "reason")

    def to_json(self) -> dict:
        # "kind" is written only for kinds other than "run": run directories written before it have none
        fixed = {k: getattr(self, k) for k in self.FIELDS if not (k == "kind" and self.kind == "run")}
        return {**{k: v for k, v in fixed.items() if v is not None}, **self.more}

    @classmethod
    def from_json(cls, data: dict) -> RunInfo:
        info = cls(settings=data.get("settings", {}), started=data.get("started", ""),
                   environment=data.get("environment", {}), kind=data.get("kind", "run"),
                   status=data.get("status", "running"), sessions=list(data.get("sessions", [])),
                   finished=data.get("finished"), reason=data.get("reason"),
                   more={k: v for k, v in data.items() if k not in cls.FIELDS})
        if "sessions" not in data:  # a run written before sessions were kept: its first session is the top level
            info.sessions = [{k: data[k] for k in ("started", "finished", "environment", "peak_rss_mb", "energy_j")
                              if k in data}]
        return info


class RunFolder:
    """One results folder: its run.json and its tables of per-prompt parts."""

    def __init__(self, path: Path, tables: tuple[str, ...]) -> None:
        self.path = path
        self.tables = tables  # written in this order; the last one marks a finished prompt

    # ------------------------------------------------------------------------------------ run.json
    def read_info(self) -> RunInfo:
        return RunInfo.from_json(json.loads((self.path / "run.json").read_text()))

    def write_info(self, info: RunInfo) -> None:
        with self._writing(self.path / "run.json") as target:
            write_atomically(target, lambda tmp: tmp.write_text(json.dumps(info.to_json(), indent=2, default=str)))

    def resumed(self, settings: dict, environment: dict, measured: tuple[str, ...] = MEASURED,
                weights: dict[str, str] | None = None, target: str | None = None) -> RunInfo:
        """run.json of the run being resumed, after checking that this session makes the same records: the same
        settings, the same drafter weights (`weights`, when the kind records them) and, for a timed run, the same
        machine facts (`measured`)."""
        info = self.read_info()
        settings = json.loads(json.dumps(settings, default=str))
        keys = [*settings, *(k for k in LEGACY_SETTINGS if k in info.settings and k not in settings)]
        changed = [k for k in keys
                   if info.settings.get(k, LEGACY_SETTINGS.get(k)) != settings.get(k, LEGACY_SETTINGS.get(k))]
        if changed:
            raise UsageError(f"--resume: {self.path} was run with different settings ({', '.join(changed)})")
        recorded = info.more.get("drafter_weights", weights)  # runs written before weights were recorded: not checked
        if weights is not None and recorded != weights:
            changed = sorted(n for n in {*recorded, *weights} if recorded.get(n) != weights.get(n))
            raise UsageError(f"--resume: the {', '.join(changed)} drafter weights differ from those {self.path} was "
                             f"run with; start a new --out for the new weights")
        before_target = info.more.get("target_weights", target)  # runs written before it was recorded: not checked
        if target is not None and before_target != target:
            raise UsageError(f"--resume: {self.path} was run on target {before_target}, this run loads {target}; "
                             f"start a new --out for the new weights")
        before = info.environment
        moved = [f"{k} {before.get(k)} -> {environment.get(k)}" for k in measured if before.get(k) != environment.get(k)]
        if moved:
            raise UsageError(f"--resume: {self.path} was measured differently ({'; '.join(moved)}); resume it with "
                             f"the same machine and --threads, or start a new --out")
        return info

    def start(self, info: RunInfo, session: dict) -> None:
        """A session begins: the tables' folders exist, run.json says "running" and lists the session."""
        for table in self.tables:
            with self._writing(self.path / f"{table}.parquet") as folder:
                folder.mkdir(parents=True, exist_ok=True)
        info.status, info.reason = "running", None
        info.sessions.append(session)
        self.write_info(info)

    def complete(self, info: RunInfo, **facts) -> None:
        """Every prompt is done: the session's end time and `facts` (what a kind measured of it) into the last
        session, run.json "complete" with the run's totals over its sessions."""
        info.sessions[-1].update(finished=now(), **facts)
        info.status, info.finished = "complete", info.sessions[-1]["finished"]
        info.more.update(session_totals(info.sessions))
        self.write_info(info)

    # ------------------------------------------------------------------------------------ parts
    def finished(self) -> set[int]:
        """Selection indices whose marking part exists; the other tables' parts of unfinished prompts and any
        half-written file are removed."""
        marker = self.path / f"{self.tables[-1]}.parquet"
        done = {_index(p) for p in marker.glob("part-*.parquet")}
        for table in self.tables[:-1]:
            for part in (self.path / f"{table}.parquet").glob("part-*.parquet"):
                if _index(part) not in done:
                    part.unlink()
        for tmp in self.path.rglob(".*.tmp"):
            tmp.unlink()
        return done

    def finished_outputs(self, among: range | None = None) -> list[list[int]]:
        """The finished prompts' output ids, turn by turn, in selection order (what a resume replays); `among`:
        only the parts with these indices (one pass of `run --repeat`)."""
        folder = self.path / f"{self.tables[-1]}.parquet"
        parts = sorted(p for p in folder.glob("part-*.parquet") if among is None or _index(p) in among)
        if not parts:
            return []
        frame = pd.concat([pq.read_table(p, columns=["index", "turn", "output_ids"]).to_pandas() for p in parts])
        return [[int(t) for t in ids] for ids in frame.sort_values(["index", "turn"]).output_ids]

    def write_prompt(self, index: int, parts: dict[str, pa.Table]) -> None:
        """One prompt's rows, a part per table, each whole or not at all, the marking table last."""
        for table in self.tables:
            if table in parts:
                with self._writing(self.path / f"{table}.parquet" / f"part-{index:05d}.parquet") as path:
                    write_atomically(path, lambda tmp: pq.write_table(parts[table], tmp))

    @contextmanager
    def _writing(self, path: Path) -> Iterator[Path]:
        try:
            yield path
        except OSError as err:
            raise WriteFailed(f"cannot write {path}: {err.strerror or err}") from None

    # ------------------------------------------------------------------------------------ the session
    @contextmanager
    def session(self, resume: bool, note: Callable[[str], None]) -> Iterator[RunFolder]:
        """Own the folder for the block (`folders.claim`), with SIGTERM handled as Ctrl-C; a block that ends by
        an interruption or a failure (a write, an engine) leaves run.json "interrupted" or "failed" with the
        reason, and every finished prompt in place for `--resume`."""
        with claim(self.path, resume, note), _sigterm_interrupts():
            try:
                yield self
            except KeyboardInterrupt as err:
                self._end_early("interrupted", "SIGTERM" if isinstance(err, Terminated) else "Ctrl-C")
                raise
            except RunFailed as err:
                self._end_early("failed", str(err))
                raise

    def _end_early(self, status: str, reason: str) -> None:
        """Say in run.json how the session ended, if a session had started and run.json can still be written."""
        try:
            info = self.read_info()
        except (OSError, ValueError):
            return  # nothing started (the model was still loading on a fresh run), or run.json is unreadable
        if info.status != "running":
            return
        info.status, info.reason = status, reason
        if info.sessions:
            info.sessions[-1].update(finished=now(), ended=status)
        try:
            self.write_info(info)
        except WriteFailed:
            pass  # the disk is still full: run.json keeps "running", the error line already says why


# ---------------------------------------------------------------------------------------------- the driver
@dataclass
class Start:
    """What a job says before anything loads: run.json's settings and kind, this session (`new_session`), and
    what a resume must find unchanged (the machine facts `measured`, the drafter `weights`)."""

    settings: dict
    session: dict
    kind: str = "run"
    measured: tuple[str, ...] = MEASURED
    weights: dict[str, str] | None = None
    target: str | None = None  # the target's weights (`loading.target_weights`), for the kinds that record them


class PromptJob(Protocol):
    """A kind of run: what it does with the prompts. `record` does the rest (folder, resume, order, parts,
    progress)."""

    def begin(self) -> Start:
        """Its settings and session, before anything loads (a resume is checked against them)."""

    def prepare(self) -> dict:
        """Load what decoding needs and check every prompt fits; returns the keys a new run's run.json gets
        (`RunInfo.more`)."""

    def running(self, info: RunInfo, save: Callable[[], None]) -> AbstractContextManager:
        """Compile or start the engine, noting what that found in `info.more` (`save()` writes run.json); every
        prompt is decoded inside the block, which stops what it started."""

    def warm_up(self, prompt: Prompt) -> None:
        """Decode a warm-up prompt: not recorded, but cross-prompt state (a suffix cache) keeps its outputs."""

    def absorb(self, output_ids: list[int]) -> None:
        """Take in a finished prompt's turn output on resume, as if it had just been decoded."""

    def decode_all(self, todo: list[tuple[int, Prompt]], finished: Callable[[int, Prompt, dict], None]) -> None:
        """Decode the prompts `todo`, handing each one's rows (a table per name of the folder's tables) to
        `finished` as soon as it is done (`OneAtATime`: in order, with `decode`)."""

    def stats(self) -> str:
        """The progress bar's live text after the latest prompt."""

    def replayed(self) -> list[tuple[int, dict]]:
        """Once `running`'s block has ended: the rows of prompts this session decoded, written again with their
        greedy replays (greedy_replay.py) where those had to wait (a batch's, until no sequence was in flight; a
        production engine's, until it stopped and left its memory to our reference target); else none."""

    def facts(self, info: RunInfo) -> dict:
        """After the last prompt: what the session measured (tokens, memory, energy) for run.json's session, and
        any run-level keys into `info.more`."""


class OneAtATime:
    """A job that decodes one prompt at a time (`decode`), in the selection's order."""

    def decode(self, index: int, prompt: Prompt) -> dict:
        raise NotImplementedError

    def decode_all(self, todo: list[tuple[int, Prompt]], finished: Callable[[int, Prompt, dict], None]) -> None:
        for index, prompt in todo:
            finished(index, prompt, self.decode(index, prompt))


@dataclass
class Opened:
    """A job whose session has begun on its folder: run.json as written, and the prompts already finished."""

    folder: RunFolder
    job: PromptJob
    info: RunInfo
    done: set[int]

    def save(self) -> None:
        self.folder.write_info(self.info)


def open_job(folder: RunFolder, job: PromptJob, resume: bool, more: dict | None = None) -> Opened:
    """Check a resume against the job's settings, load what it needs (`prepare`; a prompt past the model's
    context is refused here, before the run starts), and begin its session. `more`: keys a new run's run.json
    gets besides the job's own."""
    start = job.begin()
    resumed = (folder.resumed(start.settings, start.session["environment"], start.measured, start.weights,
                              start.target) if resume else None)
    done = folder.finished() if resumed else set()
    prepared = job.prepare()
    info = resumed or RunInfo(start.settings, start.session["started"], start.session["environment"], start.kind,
                              more={**prepared, **(more or {})})
    folder.start(info, start.session)
    return Opened(folder, job, info, done)


def catch_up(run: Opened, warmup: list[Prompt], among: range | None = None) -> None:
    """Warm-up prompts first, then the finished prompts' outputs (those whose index is in `among`, default all)
    replayed into the job's cross-prompt state, so that it holds what an uninterrupted run's would."""
    for prompt in warmup:
        run.job.warm_up(prompt)
    for ids in run.folder.finished_outputs(among):
        run.job.absorb(ids)


def _builtin_warmup_note(warmup: list[Prompt], console: Console) -> None:
    if warmup and warmup[0].dataset == "builtin":
        console.print("warm-up: every prompt of the dataset is scored, so a built-in prompt warms up", highlight=False)


def record_run(plan, console: Console, model=None) -> Path:
    """`run`'s whole life for one checked plan (`planning.plan`): take the results folder (one writer per folder),
    record the run with its engine's job (`registry.ENGINES`), print its summary. `model`: an already loaded
    target of the plan's model, device and dtype (our engine)."""
    from specbench_cli.analysis.summary import print_summary
    from specbench_cli.records import RUN_TABLES
    from specbench_cli.registry import engine_entry

    for line in plan.notes:
        console.print(line, highlight=False, soft_wrap=True)
    folder = RunFolder(plan.out, RUN_TABLES)
    job = engine_entry(plan.config.engine).make_job(plan, console, model)
    with folder.session(plan.config.resume, lambda line: console.print(line, highlight=False)):
        record(folder, job, plan.prompts, plan.warmup, plan.config.resume, console, job.label)
    print_summary(plan.out, console)
    return plan.out


def record(folder: RunFolder, job: PromptJob, prompts: list[Prompt], warmup: list[Prompt], resume: bool,
           console: Console, label: str) -> None:
    """Run `job` over the folder (inside `folder.session`): every prompt of the selection not yet finished is
    decoded and written as it finishes."""
    run = open_job(folder, job, resume)
    todo = [(i, p) for i, p in enumerate(prompts) if i not in run.done]
    with job.running(run.info, run.save):
        _builtin_warmup_note(warmup, console)
        catch_up(run, warmup)
        with record_progress(console, len(prompts), todo, label) as advance:
            def finished(index: int, prompt: Prompt, tables: dict) -> None:
                folder.write_prompt(index, tables)
                advance(prompt, job.stats())

            job.decode_all(todo, finished)
    for index, tables in job.replayed():  # a killed run keeps the rows written above, unreplayed
        folder.write_prompt(index, tables)
    folder.complete(run.info, prompts=len(todo), **job.facts(run.info))


class Interleavable(PromptJob, Protocol):
    """A job that decodes one prompt when asked (`OneAtATime.decode`) and can start a pass over the selection
    afresh (`new_pass`): what `record_interleaved` needs."""

    def decode(self, index: int, prompt: Prompt) -> dict:
        """One prompt's tables."""

    def new_pass(self) -> None:
        """Drop cross-prompt state (a suffix cache) so that the next pass starts as a new run would."""

    def starting(self) -> AbstractContextManager:
        """Start in the background what `running` will wait for (a vLLM engine), so that the members' engines
        boot side by side; stop it on the way out if `running` never took it over."""


def record_interleaved(members: list[tuple[RunFolder, Interleavable, bool]], prompts: list[Prompt],
                       warmup: list[Prompt], passes: int, console: Console, label: str, pairing: dict) -> None:
    """Several jobs over the same prompts, each into its own folder, taken in turn prompt by prompt with the
    order rotated one place per prompt, so that a drift of the machine touches every job alike (`run --method
    a,b,c`); `passes` times over the selection (`--repeat`), each pass's rows marked with its `repeat` and written
    as parts `pass * len(prompts) + index`. Every pass starts each job's cross-prompt state afresh (a suffix cache
    holding the last pass's answers would accept them whole). `pairing` goes into each new run.json (with the
    member's name), so that `report` knows whose measurements were taken side by side. A member's flag says
    whether its folder is resumed. Energy is not recorded per member: they share the machine's time."""
    opened = [open_job(folder, job, resume, {"pairing": {**pairing, "member": folder.path.name}})
              for folder, job, resume in members]
    n = len(prompts)
    units = [(p, p * n + i, prompt) for p in range(passes) for i, prompt in enumerate(prompts)]
    todo = [(index, prompt) for run in opened for _, index, prompt in units if index not in run.done]
    with ExitStack() as stack:
        for run in opened:
            stack.enter_context(run.job.starting())
        for run in opened:
            stack.enter_context(run.job.running(run.info, run.save))
        _builtin_warmup_note(warmup, console)
        with record_progress(console, len(units) * len(opened), todo, label) as advance:
            for p in range(passes):
                this_pass = range(p * n, (p + 1) * n)
                if all(index in run.done for run in opened for index in this_pass):
                    continue  # a resumed pass every member finished: the next one starts afresh anyway
                for run in opened:
                    if p:
                        run.job.new_pass()
                    catch_up(run, warmup, this_pass)
                for _, index, prompt in units[p * n:(p + 1) * n]:
                    shift = index % len(opened)  # the order rotated one place per prompt
                    for run in opened[shift:] + opened[:shift]:
                        if index not in run.done:
                            run.folder.write_prompt(index, {name: _marked(table, p)
                                                            for name, table in run.job.decode(index, prompt).items()})
                            advance(prompt, f"{run.folder.path.name}: {run.job.stats()}")
    for run in opened:
        for index, tables in run.job.replayed():
            run.folder.write_prompt(index, {name: _marked(table, index // n) for name, table in tables.items()})
    for run in opened:
        todo_here = sum(index not in run.done for _, index, _ in units)
        run.folder.complete(run.info, prompts=todo_here, **run.job.facts(run.info))


def _marked(table: pa.Table, repeat: int) -> pa.Table:
    """A table's rows marked as decoded in pass `repeat`."""
    column = pa.array([repeat] * len(table), pa.int64())
    at = table.schema.get_field_index("repeat")
    return table.set_column(at, "repeat", column) if at >= 0 else table.append_column("repeat", column)


def new_session(device, telemetry: dict | None = None) -> dict:
    """A session's start time and machine (`hardware.environment`, and any telemetry facts)."""
    return {"started": now(), "environment": {**hardware.environment(device), **(telemetry or {})}}


def session_totals(sessions: list[dict]) -> dict:
    """Top-level memory and energy of a run made of sessions: the peak over sessions, the summed energy (only what
    the sessions recorded: an oracle's record neither)."""
    totals = {k: max(s[k] for s in sessions if k in s) for k in ("peak_rss_mb", "cuda_max_allocated_mb",
                                                                  "cuda_max_reserved_mb") if any(k in s for s in sessions)}
    if all("energy_j" in s and "tokens" in s for s in sessions):
        joules, tokens = sum(s["energy_j"] for s in sessions), sum(s["tokens"] for s in sessions)
        totals.update(energy_j=round(joules, 3), energy_per_token_j=round(joules / tokens, 6) if tokens else None)
    return totals


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM raises `Terminated` (a KeyboardInterrupt) in the main thread."""
    def interrupt(signum, frame):
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _index(part: Path) -> int:
    return int(part.stem.split("-")[1])
