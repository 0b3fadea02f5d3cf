"""`report --expect FILE`: check runs against published numbers.

An expect file (TOML; the parity suite's files in benchmarks/parity/ are also sweep configs that make the
runs) lists `[[expect]]` entries, each a published value with its source and the exact setting it was
measured in:

    [[expect]]
    source = "vllm-project/vllm tests/v1/spec_decode/test_acceptance_length.py"
    model = "llama3.1-8b"                                  # as in the runs' settings
    dataset = "mt-bench-1turn"
    method = "eagle3[depth=2,top_k=1,total_token=4]"     # the report's method label
    temperature = 0.0
    metric = "tau"               # "tau" (Σ tokens / Σ rounds) or "tau_turn_mean" (mean of per-turn τ)
    value = 2.60
    rtol = 0.05                  # |actual - value| / value must not exceed it
    positions = [0.7296, 0.5208, 0.3545]   # optional αk = P(accepted ≥ k); each must reach value·(1 - rtol)

Per-position rates are checked one-sided, as vLLM's test does: a drafter may do better than published.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specbench_cli.core.errors import UsageError
from specbench_cli.analysis.metrics import group_column, position_acceptance, summarise, tau_turn_mean
from specbench_cli.analysis.results import Results, RunGroup
from specbench_cli.analysis.tables import Table

METRICS = ("tau", "tau_turn_mean")


@dataclass(frozen=True)
class Expectation:
    source: str
    model: str
    dataset: str
    method: str
    temperature: float
    metric: str
    value: float
    rtol: float
    positions: tuple[float, ...] = ()

    def matches(self, group: RunGroup) -> bool:
        s = group.info["settings"]
        return (s["model"], s["dataset"], group.label, float(s["temperature"])) == (
            self.model, self.dataset, self.method, self.temperature)

    def name(self) -> str:
        return f"{self.model}/{self.dataset}/{self.method}/t{self.temperature:g}"


def load_expectations(path: Path) -> list[Expectation]:
    """The `[[expect]]` entries of `path`, each checked for its fields and their types."""
    try:
        entries = tomllib.loads(path.read_text()).get("expect")
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise UsageError(f"--expect {path}: {err}") from None
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"--expect {path}: no [[expect]] entries")
    return [_expectation(path, i, entry) for i, entry in enumerate(entries, 1)]


def _expectation(path: Path, i: int, e: dict) -> Expectation:
    where = f"--expect {path}: entry {i}"
    for key, kind in (("source", str), ("model", str), ("dataset", str), ("method", str), ("metric", str)):
        if not isinstance(e.get(key), kind):
            raise UsageError(f"{where}: '{key}' must be a string")
    for key in ("temperature", "value", "rtol"):
        if not isinstance(e.get(key), (int, float)) or isinstance(e.get(key), bool) or not math.isfinite(e[key]):
            raise UsageError(f"{where}: '{key}' must be a number")
    if e["metric"] not in METRICS:
        raise UsageError(f"{where}: metric '{e['metric']}' is not one of {', '.join(METRICS)}")
    if e["value"] <= 0 or not 0 <= e["rtol"] < 1:
        raise UsageError(f"{where}: value must be > 0 and rtol in [0, 1)")
    positions = e.get("positions", [])
    if not isinstance(positions, list) or not all(isinstance(p, (int, float)) for p in positions):
        raise UsageError(f"{where}: 'positions' must be a list of numbers")
    return Expectation(e["source"], e["model"], e["dataset"], e["method"], float(e["temperature"]), e["metric"],
                       float(e["value"]), float(e["rtol"]), tuple(float(p) for p in positions))


def check(results: Results, expectations: list[Expectation]) -> tuple[Table, list[str]]:
    """A table of expected against measured values, and one line per expectation that is missed or missing."""
    rows, problems = [], []
    for e in expectations:
        groups = [g for g in results.groups if e.matches(g)]
        if not groups:
            problems.append(f"{e.name()}: no run matches (model, dataset, method label, temperature)")
            rows.append(_row(e, None, "missing"))
        for g in groups:
            actual, off = _measure(e, g)
            problems += [f"{e.name()}: {line}" for line in off]
            rows.append(_row(e, actual, "ok" if not off else "OFF", g))
    return Table("parity", "Published values against these runs", pd.DataFrame(rows),
                 "τ: Σ tokens / Σ rounds; τ turn-mean: mean of per-turn τ; αk checked one-sided"), problems


def _measure(e: Expectation, g: RunGroup) -> tuple[dict, list[str]]:
    value = (summarise(g.prompts, group_column(g.prompts)).iloc[-1].tau if e.metric == "tau"
             else tau_turn_mean(g.prompts))
    off = []
    error = abs(value - e.value) / e.value if value == value else math.inf
    if error > e.rtol:
        off.append(f"{e.metric} {value:.3f}, published {e.value:.3f} ({error:.1%} off; tolerance {e.rtol:.0%})")
    rates = position_acceptance(g.rounds, len(e.positions)).rate.tolist() if e.positions else []
    for k, (got, want) in enumerate(zip(rates, e.positions), 1):
        if not got >= want * (1 - e.rtol):
            off.append(f"α{k} {got:.4f} below published {want:.4f} - {e.rtol:.0%}")
    return {"actual": value, "αk actual": " ".join(f"{r:.3f}" for r in rates) or "—"}, off


def _row(e: Expectation, actual: dict | None, status: str, g: RunGroup | None = None) -> dict:
    return {"model": e.model, "dataset": e.dataset, "method": e.method, "T": e.temperature, "metric": e.metric,
            "published": e.value, "actual": (actual or {}).get("actual", math.nan),
            "αk published": " ".join(f"{p:.3f}" for p in e.positions) or "—",
            "αk actual": (actual or {}).get("αk actual", "—"), "status": status,
            "run": ", ".join(d.name for d in g.dirs) if g else "—", "source": e.source}
