"""Results directories as one dataset: every run below the given paths, shards and resumed parts merged.

A *run group* is one experiment: the same method (and non-default options), drafter weights, model, dataset,
sampling and length settings, dtype, target and hardware. Shards of a sweep and repeated directories of the same
experiment fall into one group; a prompt/turn recorded twice keeps its newest record.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specbench_cli.core.errors import UsageError
from specbench_cli.options import options_record
from specbench_cli.hardware import hardware_key
from specbench_cli.records import read_table

# Settings that make two runs the same experiment (besides the method label and the hardware).
SAME_EXPERIMENT = ("model", "dataset", "temperature", "max_new_tokens", "dtype", "target", "engine", "concurrency",
                   "batch_size")
# What a setting meant in runs written before it existed (our engine, one request at a time).
BEFORE = {"engine": "specbench", "concurrency": 1, "batch_size": 1}


@dataclass
class RunGroup:
    label: str  # method, with its non-default options: "eagle3[depth=4]"
    dirs: list[Path]
    info: dict  # run.json of the newest directory
    prompts: pd.DataFrame
    rounds: pd.DataFrame

    @property
    def method(self) -> str:
        return self.info["settings"]["method"]

    @property
    def hardware(self) -> str:
        return hardware_key(self.info.get("environment", {}))

    def experiment(self) -> tuple:
        return experiment_key(self.info)

    @property
    def drafters(self) -> dict[str, str]:
        return drafter_identity(self.info)

    @property
    def pairing(self) -> str | None:
        """The id of the interleaved list (`run --method a,b`) this run was measured in, if any."""
        return pairing_id(self.info)

    @property
    def second_of_pair(self) -> bool:
        """Whether this is the second baseline of an A/A pair (`baseline-2`), whose "speedup" is the noise."""
        member = self.info.get("pairing", {}).get("member")
        return bool(member) and member != self.method


@dataclass
class OracleRun:
    dir: Path
    info: dict
    replay: pd.DataFrame  # per position and drafter: accepted (see specbench_cli.analysis.oracles)


@dataclass
class Calibration:
    """A router calibration (`specbench calibrate` artifact): its card and threshold sweep."""

    dir: Path
    card: dict
    sweep: pd.DataFrame


@dataclass
class Results:
    groups: list[RunGroup]
    oracles: list[OracleRun]
    calibrations: list[Calibration] = dataclasses.field(default_factory=list)

    def baseline_for(self, group: RunGroup) -> RunGroup | None:
        """The baseline group of the same experiment on the same hardware, if any: the one measured side by side
        with `group` first (the same `pairing`), and of an A/A pair the first member (`baseline`, not
        `baseline-2`)."""
        same = [o for o in self.groups if o.method == "baseline" and o.experiment() == group.experiment()]
        paired = [o for o in same if o.pairing is not None and o.pairing == group.pairing]
        found = paired or same
        return min(found, key=lambda o: o.second_of_pair) if found else None

    @staticmethod
    def paired(group: RunGroup, base: RunGroup) -> bool:
        """Whether the two were measured interleaved, prompt by prompt (`run --method a,b`)."""
        return group.pairing is not None and group.pairing == base.pairing

    def beside(self, group: RunGroup, method: str) -> RunGroup | None:
        """The first group of `method` in the same experiment on the same hardware as `group`, if any."""
        return next((o for o in self.groups if o.method == method and o.experiment() == group.experiment()), None)

    def baseline_elsewhere(self, group: RunGroup) -> RunGroup | None:
        """A baseline of the same settings but measured on other hardware (named, never compared)."""
        mine = group.experiment()[:-1]
        for other in self.groups:
            if other.method == "baseline" and other.experiment()[:-1] == mine and other.hardware != group.hardware:
                return other
        return None


def find_calibrations(paths: list[Path]) -> list[Calibration]:
    """Calibration folders (a card naming a routed method, beside its sweep.csv) below the paths."""
    found = []
    for path in paths:
        for sweep in sorted(path.rglob("sweep.csv")) if path.is_dir() else []:
            card = json.loads((sweep.parent / "config.json").read_text()) if (sweep.parent / "config.json").exists() else {}
            if str(card.get("method", "")).startswith(("whiflash", "hvd")):
                found.append(Calibration(sweep.parent, card, pd.read_csv(sweep)))
    return found


def find_run_dirs(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise UsageError(f"results directory not found: {path}")
        found += sorted(p.parent for p in ([path / "run.json"] if (path / "run.json").exists() else path.rglob("run.json")))
    if not found:
        raise UsageError(f"no runs found under {', '.join(map(str, paths))} (a run directory holds run.json)")
    return sorted(set(found), key=lambda p: (p.stat().st_mtime, str(p)))


def load(paths: list[Path]) -> Results:
    groups: dict[tuple, list[tuple[Path, dict]]] = {}
    oracles = []
    for d in find_run_dirs(paths):
        info = read_info(d)
        if info.get("kind") == "oracle":
            oracles.append(OracleRun(d, info, pd.read_parquet(d / "replay.parquet")))
            continue
        key = (member_label(info), json.dumps(drafter_identity(info), sort_keys=True), *experiment_key(info))
        groups.setdefault(key, []).append((d, info))
    merged = [_merge(key[0], members) for key, members in groups.items()]
    _tell_apart(merged)
    return Results(merged, oracles, find_calibrations(paths))


def read_info(run_dir: Path) -> dict:
    """A run's run.json, or one line saying why it cannot be used."""
    path = run_dir / "run.json"
    try:
        info = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UsageError(f"{path}: not a readable run.json ({str(err).splitlines()[0]}); move the folder aside or fix it") from None
    if not isinstance(info, dict) or not isinstance(info.get("settings"), dict):
        raise UsageError(f"{path}: has no 'settings' (not written by specbench run or oracle); move the folder aside")
    return info


def _tell_apart(groups: list[RunGroup]) -> None:
    """Groups of one method, model and dataset that differ in other settings get those settings in their
    label, so every table row says what it is: "suffix (max_new_tokens=128)", "eagle3 (eagle3=r3/eagle3#1c0e2f9a)"."""
    same: dict[tuple, list[RunGroup]] = {}
    for g in groups:
        same.setdefault((g.label, g.info["settings"]["model"], g.info["settings"]["dataset"]), []).append(g)
    names = (*SAME_EXPERIMENT, "target_weights", "hardware")
    for clash in (c for c in same.values() if len(c) > 1):
        keys = [g.experiment() for g in clash]
        differ = [i for i in range(len(names)) if len({k[i] for k in keys}) > 1]
        drafters = sorted({n for g in clash for n in g.drafters if len({h.drafters.get(n) for h in clash}) > 1})
        for g, k in zip(clash, keys):
            parts = [f"{names[i]}={k[i].strip(chr(34))}" for i in differ]
            parts += [f"{n}={_drafter_name(g, n)}" for n in drafters]
            g.label += " (" + ", ".join(parts) + ")"


def drafter_identity(info: dict) -> dict[str, str]:
    """The drafter weights a run used (name -> fingerprint or hub id, `planning.drafter_weights`); for runs written
    before those were recorded, the `--drafter` overrides it named ({} for the registered drafters)."""
    return info.get("drafter_weights") or info["settings"].get("drafters") or {}


def _drafter_name(group: RunGroup, name: str) -> str:
    """How a label names one drafter: the `--drafter` folder's last two parts (or "registered"), then a short
    fingerprint, or a hub drafter's commit, when one was recorded."""
    ref = group.info["settings"].get("drafters", {}).get(name)
    where = "/".join(Path(ref).parts[-2:]) if ref else "registered"
    weights = group.info.get("drafter_weights", {}).get(name)
    if not weights or weights == ref:
        return where
    return f"{where}#{weights.rpartition('@')[2][:8]}"  # a hub drafter's commit, or a local fingerprint


def _merge(label: str, members: list[tuple[Path, dict]]) -> RunGroup:
    """Concatenate the members' records (oldest first) and keep the newest record of each prompt/turn (and
    repeat: `run --repeat` records a prompt once per pass)."""
    dirs = [d for d, _ in members]
    prompts = pd.concat([read_table(d, "prompts") for d in dirs], ignore_index=True)
    rounds = pd.concat([read_table(d, "rounds") for d in dirs], ignore_index=True)
    keep = prompts.drop_duplicates(["prompt_id", "turn", "repeat"], keep="last")
    rounds = rounds[rounds.run.isin(keep.run.unique())]
    rounds = rounds.merge(keep[["run", "prompt_id", "turn", "repeat"]], on=["run", "prompt_id", "turn", "repeat"])
    return RunGroup(label, dirs, members[-1][1], keep.reset_index(drop=True), rounds)


def _same(default: object, value: object) -> bool:
    """Equal, counting NaN (an option meaning "the calibrated value") as equal to NaN."""
    nan = lambda x: isinstance(x, float) and x != x  # noqa: E731
    return default == value or (nan(default) and nan(value))


def experiment_key(info: dict) -> tuple:
    """What a baseline must share with a run for a speedup to mean anything; the hardware comes last."""
    s = info["settings"]
    return (*(json.dumps(s.get(k, BEFORE.get(k))) for k in SAME_EXPERIMENT), json.dumps(info.get("target_weights")),
            hardware_key(info.get("environment", {})))


def pairing_id(info: dict) -> str | None:
    """run.json's interleaved-list id (`run --method a,b`), if the run was one of a list."""
    return info.get("pairing", {}).get("id")


def member_label(info: dict) -> str:
    """A run's label: its method and options (`method_label`), or for the second of an A/A pair its member name
    (`baseline-2`), so that the pair stays two groups."""
    member, settings = info.get("pairing", {}).get("member"), info["settings"]
    if not member or member == settings["method"]:
        return method_label(settings)
    engine = settings.get("engine", BEFORE["engine"])
    return member if engine == BEFORE["engine"] else f"{engine}:{member}"


def method_label(settings: dict) -> str:
    """The method name plus the options that differ from its defaults, so sweeps stay apart."""
    method, options = settings["method"], settings.get("options", {})
    try:
        from specbench_cli.registry import method_class

        defaults = options_record(method_class(method).Options())
    except UsageError:  # a method this version does not know: show every option
        defaults = {}
    changed = [f"{k}={v}" for k, v in options.items() if not _same(defaults.get(k, object()), v)]
    engine = settings.get("engine", BEFORE["engine"])
    name = method if engine == BEFORE["engine"] else f"{engine}:{method}"  # "vllm:eagle3" beside our "eagle3"
    label = f"{name}[{','.join(changed)}]" if changed else name
    return label + acceptance_mark(settings)


def acceptance_mark(settings: dict) -> str:
    """A run with `--acceptance` is a projection, never a measurement of its method: `@synthetic:0.7` or
    `@profile:NAME` on its label, so that it never merges with the method's own runs."""
    source = settings.get("acceptance")
    if not source:
        return ""
    kind, _, value = source.partition(":")
    return f"@{kind}:{Path(value).stem}" if kind == "profile" else f"@{source}"
