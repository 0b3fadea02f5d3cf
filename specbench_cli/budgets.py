"""The budgets `tune` chooses among and where a run finds the one it chose: the candidate grids per method, the
machine key a tuned budget holds for, the tune record (`tune.json`) and `run --tuned`'s look-up; and the CPU
budgets `run` drafts where a paper's budget does not pay on a CPU. Below the commands, since `planning` applies
them; how `tune` prices and measures the candidates is commands/tune/.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch

from specbench_cli.core.dtypes import dtype_name
from specbench_cli.core.errors import UsageError
from specbench_cli.folders import write_atomically
from specbench_cli.inputs import LOADS
from specbench_cli.models import cache_root
from specbench_cli.registry import ENGINES, engine_entry

# Candidate draft lengths for `tune --engine vllm` (vLLM 0.32 drafts one chain of num_speculative_tokens for each
# of these methods; engines/vllm_methods.py maps the options), the paper budget added first.
VLLM_GRIDS: dict[str, list[tuple[str, ...]]] = {
    "suffix": [("max_spec_tokens=4",), ("max_spec_tokens=8",), ("max_spec_tokens=16",), ("max_spec_tokens=32",)],
    "pld": [("num_pred_tokens=2",), ("num_pred_tokens=4",), ("num_pred_tokens=6",)],
    "sps": [("k=2",), ("k=3",), ("k=4",), ("k=8",)],
    "eagle3": [("top_k=1", f"depth={k - 1}", f"total_token={k + 1}") for k in (2, 3, 4, 6)],
    "dflash": [("block_size=3",), ("block_size=4",), ("block_size=6",), ("block_size=8",)],
}

# The methods whose vLLM proposer takes the draft length every step, so that vLLM's per-batch-size table applies
# (vLLM 0.32: SpecDecodeBaseProposer.propose sets it, vllm/v1/spec_decode/llm_base_proposer.py:512-532; the n-gram
# proposer takes any K up to its own, ngram_proposer.py:148). Its suffix proposer asserts the configured K
# (suffix_decoding.py:43): there `run --tuned` starts the engine with the K chosen for its concurrency.
VLLM_PER_STEP_K: dict[str, str] = {"pld": "ngram_proposer.py:148", "sps": "llm_base_proposer.py:532",
                                   "eagle3": "llm_base_proposer.py:532", "dflash": "llm_base_proposer.py:532"}

# Candidate budgets, as --opt strings; the paper's default is the one with no options (it is always a
# candidate). The sizes span what a CPU (a few nodes) to a GPU (tens of nodes) verifies at the price of one.
GRIDS: dict[str, list[tuple[str, ...]]] = {
    # chains of 1-4 tokens (the search drafts min(depth, total_token - 2) levels, so depth=3 with 3 tokens is the
    # 2-token chain of depth 1, as tuned before the chains were added), then trees
    "eagle3": [("depth=0", "top_k=1", "total_token=2"), ("depth=3", "top_k=1", "total_token=3"),
               ("depth=2", "top_k=1", "total_token=4"), ("depth=3", "top_k=1", "total_token=5"),
               ("depth=3", "top_k=4", "total_token=8"),
               ("depth=4", "top_k=4", "total_token=12"), ("depth=5", "top_k=6", "total_token=16"),
               ("depth=6", "top_k=8", "total_token=24"), ("depth=6", "top_k=10", "total_token=32")],
    # total counts draft nodes, the root comes on top: total=7 is one 8-row block where a batch-invariant target
    # takes its GEMMs 8 rows at a time
    "dart": [("total=7",), ("total=8",), ("total=12",), ("total=16",), ("total=24",), ("total=32",)],
    "dflash": [("block_size=3",), ("block_size=4",), ("block_size=6",)],
    "sps": [("k=2",), ("k=3",), ("k=4",), ("k=8",)],
    "suffix": [("max_spec_tokens=4",), ("max_spec_tokens=8",), ("max_spec_tokens=16",), ("max_spec_tokens=32",)],
    "pld": [("num_pred_tokens=2",), ("num_pred_tokens=4",), ("num_pred_tokens=6",)],
}

# ------------------------------------------------------------------------------------------------- CPU budgets
@dataclass(frozen=True)
class CpuBudget:
    """The budget `run` drafts on a CPU where the paper's, sized for a GPU, would leave its default slower than the
    baseline and than vLLM's default for the method; `record` measured it against vLLM's default, interleaved."""

    opts: tuple[str, ...]
    record: str


# On two CPU cores a verify of 64 rows costs about four one-token decodes (docs/tune.md), which EAGLE-3's paper tree
# (60 nodes, WhiFlash seed Table 7; τ about 2 on the embedded model) does not repay. The one-token chain is what
# `tune` chose on a CPU (benchmarks/results/readme/tune-eagle3.json: 1.08x the baseline, the tree 0.37x); the
# record measures it against vLLM's default EAGLE-3.
CPU_BUDGETS: dict[str, CpuBudget] = {
    "eagle3": CpuBudget(("depth=0", "top_k=1", "total_token=2"),
                        "benchmarks/results/vllm-parity/cpu-float32-methods-defaults.json"),
}


def cpu_budget(method: str, device: torch.device, our_target: bool, opts: list[str]) -> CpuBudget | None:
    """The CPU budget `run` applies: on a CPU, on our engine, to a method that has one, and only when no --opt
    sets any of the method's options (an --opt keeps the paper's values for the options it leaves)."""
    if device.type != "cpu" or not our_target or opts:
        return None
    return CPU_BUDGETS.get(method)


def check_method(method: str) -> None:
    if method not in GRIDS:
        raise UsageError(f"tune has no budgets for '{method}'; it tunes: {', '.join(GRIDS)} "
                         "(confu cannot be replayed: its future token comes from the target's verify pass)")


def label(opts: tuple[str, ...]) -> str:
    return " ".join(opts) if opts else "paper default"



# ---------------------------------------------------------------------------------------------- where runs find it
def tuned_path(model: str, method: str, where: str) -> Path:
    """The user cache's record of the tuned budget for this model, method and machine setting."""
    return cache_root() / "tune" / model / f"{method}-{where}.json"


def machine_key(dtype: torch.dtype, device: torch.device, threads: int, invariant: bool,
                engine: str = "specbench") -> str:
    """Where a tuned budget holds: engine (a production engine's own key), dtype, device, threads and our target's
    invariance."""
    tag = engine_entry(engine).tag
    return ((f"{tag}-" if tag else "") + f"{dtype_name(dtype)}-{device.type}-{threads}t"
            + ("-invariant" if invariant else ""))


@dataclass
class TuneRecord:
    """What `tune` chose, and why: written to its folder and to `tuned_path`. A tune over load levels
    (`--batch-size` / `--concurrency`) also holds each level's choice (`levels`: load, opts, k, predicted and
    measured speedups) and, where every chosen budget is a draft length vLLM takes, vLLM's table
    (`schedule`: num_speculative_tokens_per_batch_size); `opts` is then the budget of the smallest level, but
    for vLLM with a table that of the longest chosen draft (the engine's num_speculative_tokens, the table's cap)."""

    model: str
    method: str
    machine: str
    opts: list[str]
    predicted_speedup: float | None
    measured_speedup: float | None
    paper_predicted_speedup: float | None
    paper_measured_speedup: float | None
    folder: str
    command: str
    created: str
    candidates: list[dict] = field(default_factory=list)
    engine: str = "specbench"
    load: str = ""  # "batch_size" or "concurrency" for a tune over levels
    levels: list[dict] = field(default_factory=list)
    schedule: list[list[int]] | None = None
    weights: dict[str, str] = field(default_factory=dict)  # the target's and drafters' (`planning.checkpoint_weights`)


@dataclass
class Tuned:
    """What `run --tuned` applies: the --opt list for the run's load level, vLLM's table where there is one, and
    the record they came from."""

    opts: list[str]
    path: Path
    schedule: list[list[int]] | None = None


def tuned_opts(model: str, method: str, machine: str, load: int = 1) -> Tuned:
    """The budget `run --tuned` applies at `load` (batch size or requests in flight: the choice of the largest
    tuned level not above it, else of the smallest level), and the record it came from (one line when there is
    none)."""
    check_method(method)
    path = tuned_path(model, method, machine)
    if not path.exists():
        engine = [name for name, e in ENGINES.items() if e.tag and machine.startswith(f"{e.tag}-")]
        hint = f" --engine {engine[0]} {LOADS[ENGINES[engine[0]].load][1]} LEVELS" if engine else ""
        raise UsageError(f"no tuned budget for {method} on {model} ({machine}): run `specbench tune --method {method} "
                         f"--model {model}{hint}` with the same --dtype, --device and --threads first")
    record = json.loads(path.read_text())
    opts = record["opts"]
    levels = sorted(record.get("levels") or [], key=lambda level: level["load"])
    per_step = engine_entry(record.get("engine", "specbench")).draft_table and record.get("schedule")
    if levels and not per_step:  # an engine's own table takes the draft length per step, up to opts'
        fitting = [level for level in levels if level["load"] <= load] or levels[:1]
        opts = fitting[-1]["opts"]
    return Tuned(list(opts), path, record.get("schedule"))


def write_record(record: TuneRecord, out: Path, csv: bool = True) -> Path:
    """tune.json (and, `csv`, candidates.csv) in the tune folder and the registered copy `run --tuned` reads, each
    written whole or not at all (`run --tuned` never reads half a record); returns the registered path."""
    text = json.dumps(asdict(record), indent=1, default=str)
    write_atomically(out / "tune.json", lambda tmp: tmp.write_text(text))
    if csv:
        write_atomically(out / "candidates.csv", lambda tmp: pd.DataFrame(record.candidates).to_csv(tmp, index=False))
    registered = tuned_path(record.model, record.method, record.machine)
    registered.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(registered, lambda tmp: tmp.write_text(text))
    return registered


def schedule(chosen: dict[int, int]) -> list[list[int]]:
    """vLLM's `num_speculative_tokens_per_batch_size` (vllm/config/speculative.py, 0.32: inclusive
    [range_start, range_end, K] ranges, the first starting at 1) from the draft length chosen at each load level:
    a level's K holds from it up to the next level; vLLM carries the last K to its largest batch
    (vllm/v1/spec_decode/dynamic/utils.py, build_dynamic_sd_schedule_lookup)."""
    loads = sorted(chosen)
    starts = [1, *loads[1:]]
    ends = [*(n - 1 for n in loads[1:]), loads[-1]]
    return [[s, e, chosen[n]] for s, e, n in zip(starts, ends, loads)]
