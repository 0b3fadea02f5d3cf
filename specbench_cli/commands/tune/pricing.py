"""`specbench tune`: the draft budget that maximises tokens/s on this machine (issue 36, item 2).

A method's paper budget (EAGLE-3's 60-node tree, DFlash's 16-token block) is sized for an H100, where
verifying 60 tokens costs about as much as verifying one. On a CPU it does not, and the best budget is smaller.
For every candidate budget of a method (`GRIDS`) tune predicts

    speedup = τ · t_base / (t_draft + t(1) · c(1 + n̄) + t_loop)

- τ: tokens per round, from trace replay of that candidate along the greedy traces of the tuning prompts,
  rounds stepped as a live run steps them (`analysis.oracles.round_starts`); the costs below are averaged
  over those rounds' start positions, where a live run drafts, not over every position;
- t_draft: the candidate's measured propose + observe time there during that replay, each round start timed right
  after an untimed forward of the target (`oracle.replay.replay_turn`'s cold_drafts), as a live round drafts
  after its verify: hot, the drafter's weights stayed in cache and its drafts took half the live time;
- n̄: its draft size (tree nodes), c(n): the verify cost curve measured on this machine's target, in the
  run's dtype and batch invariance (cached per model, dtype, device, threads and invariance);
- t_base: the live baseline's decode time per token on the same prompts; t_loop = t_base − t(1), the loop's own
  time per round beside the forward (sampling, commit, records);
- on a batch-invariant target whose attention runs through SDPA (float32, CUDA), a round whose draft branches
  also verifies its accepted path again as a chain (`Target.verify_path`): t(1) · c(1 + accepted) more (in half
  precision on a CPU a tree is verified once, exactly: `core.attention.exact_attention`).

This is the reasoning of Sequoia's hardware-aware tree optimiser (expected accepted tokens against the time a
verify of that size takes on the hardware at hand), applied to the candidates each method's own options can
express. Paper defaults stay the defaults; `tune` writes the best candidate where `run --tuned` finds it,
then runs it live beside the baseline (and the paper budget) and prints the predicted and measured speedups.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from specbench_cli.analysis.oracles import round_starts
from specbench_cli.analysis.scaling import run_throughput
from specbench_cli.folders import write_atomically
from specbench_cli.records import read_table
from specbench_cli.core.errors import UsageError
from specbench_cli.core.target import Target, TargetModel
from specbench_cli.core.timing import sync
from specbench_cli.core.tree import DraftTree
from specbench_cli.models import cache_root
from specbench_cli.core.dtypes import dtype_name

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
# Verify sizes whose cost is measured; c(n) between them is interpolated linearly. Every multiple of 8 and the size
# after it: where a batch-invariant target's GEMMs take rows 8 at a time (`core.target.ROW_BLOCK`: its start-up
# probe found one call unsafe on that machine), its curve steps
# up there (measured on the embedded model in bf16: c(8) = 1.44, a DART tree of 9 rows 2.3), and a line from 8 to
# 12 would price 9 rows ~30% low (DART's total=8 was predicted 0.53x and ran 0.41x before these points).
COST_ROWS = (1, 2, 3, 4, 6, 8, 9, 12, 16, 17, 24, 25, 32, 33, 40, 41, 48, 49, 56, 57, 64)


def check_method(method: str) -> None:
    if method not in GRIDS:
        raise UsageError(f"tune has no budgets for '{method}'; it tunes: {', '.join(GRIDS)} "
                         "(confu cannot be replayed: its future token comes from the target's verify pass)")


def label(opts: tuple[str, ...]) -> str:
    return " ".join(opts) if opts else "paper default"


# ---------------------------------------------------------------------------------------------- verify costs
@dataclass
class Costs:
    """The verify cost curve: t(1) in ms and c(n) = t(n) / t(1) for a verify of n rows (root included)."""

    t1_ms: float
    c: dict[int, float]
    where: str = ""  # model, dtype, device, threads, invariance, clock

    def verify_ms(self, rows: float) -> float:
        """t(1) · c(rows), c interpolated linearly between measured sizes (and extended by its last slope)."""
        ns = sorted(self.c)
        xs, ys = np.array(ns, float), np.array([self.c[n] for n in ns])
        if rows <= xs[-1]:
            return self.t1_ms * float(np.interp(max(rows, 1.0), xs, ys))
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return self.t1_ms * float(ys[-1] + slope * (rows - xs[-1]))


def random_tree(n: int, vocab: int, rng: random.Random) -> DraftTree:
    """A bushy tree of n nodes (each node's parent among the earlier ones, biased to shallow levels)."""
    return DraftTree([rng.randrange(vocab) for _ in range(n)], [rng.randint(0, i // 2) for i in range(n)])


@torch.inference_mode()
def measure_costs(target: Target | TargetModel, vocab: int, context: int = 256, reps: int = 7,
                  where: str = "") -> Costs:
    """Median wall time (perf_counter; synchronised on CUDA) of a verify of n rows after `context` tokens, a
    bushy random tree of n - 1 nodes under the root, on the target the runs use (its invariance included); on a
    target model of B slots, every slot verifies such a tree in the one forward (a batch round's verify)."""
    rng = random.Random(0)
    model = target.shared if isinstance(target, Target) else target
    ids = [rng.randrange(vocab) for _ in range(context)]
    for seq in model.slots:
        seq.prefill(ids[:-1])
    times = {}
    for n in COST_ROWS:
        work = [(seq, ids[-1], random_tree(n - 1, vocab, rng), None) for seq in model.slots]
        samples = []
        for i in range(reps + 2):
            t0 = time.perf_counter()
            model.verify(work)
            sync(model.device)
            if i >= 2:  # two warm-up calls per size
                samples.append((time.perf_counter() - t0) * 1e3)
        times[n] = statistics.median(samples)
    return Costs(times[1], {n: t / times[1] for n, t in times.items()}, where)


# Bumped whenever the engine's kernels change what a forward costs, or COST_ROWS changes, so that curves measured
# before are not reused (2: prepacked CPU weights, matmul attention for one-query rows, compiled forwards that
# leave the cache write to the host; core.kernels, core.target. 3: the sizes past each 8-row block. 4: a
# batch-invariant target's one-call GEMMs, exact attention in a few calls per layer, trees verified once. 5: the
# row attention kernel, core.row_attention. 6: every decoder layer in one C++ call, core.decoder_layers, and the
# plain target's verifies of more than 16 rows in the row kernel). 7: the kernels' row loops and exp on vectors
# (verifies of 8 and 16 rows ~20 % cheaper).
COSTS_REVISION = 7


def cached_costs(key: str, measure) -> tuple[Costs, Path]:
    """The cost curve for `key` (model, dtype, device, threads, invariance) from the user cache, measured once."""
    path = cache_root() / "tune" / f"costs-{key}-r{COSTS_REVISION}.json"
    if path.exists():
        data = json.loads(path.read_text())
        return Costs(data["t1_ms"], {int(n): v for n, v in data["c"].items()}, data.get("where", "")), path
    costs = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(costs), indent=1))
    return costs, path


# ---------------------------------------------------------------------------------------------- prediction
@dataclass
class Prediction:
    """One candidate budget priced on this machine."""

    candidate: str
    opts: tuple[str, ...]
    tau: float
    mean_draft: float
    draft_ms: float
    verify_ms: float
    round_ms: float
    tokens_per_s: float
    speedup: float


def predict(candidate: tuple[str, ...], walks: list[pd.DataFrame], costs: Costs, base_ms: float,
            reverifies: bool, batch: int = 1, draft_scale: float = 1.0) -> Prediction:
    """Price a candidate from its replay `walks` (one frame per turn: accepted, drafted, branched, draft_ms per
    position), the cost curve and the baseline's time per token (`reverifies`: the target verifies a branching
    draft's accepted path again, `TargetModel.exact_trees` False on a batch-invariant target).

    At `batch` B > 1 (`tune --batch-size`): `costs` is the curve of B sequences verifying together, `base_ms` the
    baseline's time per batch round, and the replay's draft time (one sequence) is multiplied by `draft_scale`
    (what drafting B sequences costs against one); tokens/s counts the B sequences."""
    rounds = pd.concat([w.iloc[round_starts(w.accepted.to_numpy())] for w in walks])
    tau = sum(len(w) for w in walks) / max(len(rounds), 1)
    mean_draft = float(rounds.drafted.mean())
    draft_ms = float(rounds.draft_ms.mean()) * draft_scale
    verify = [costs.verify_ms(1 + n) for n in rounds.drafted]
    if reverifies:  # a branching draft's accepted path, verified again as a chain
        verify = [v + (costs.verify_ms(1 + a) if b else 0.0)
                  for v, a, b in zip(verify, rounds.accepted, rounds.branched.astype(bool))]
    verify_ms = float(np.mean(verify))
    loop_ms = max(base_ms - costs.t1_ms, 0.0)
    round_ms = draft_ms + verify_ms + loop_ms
    return Prediction(label(candidate), candidate, tau, mean_draft, draft_ms, verify_ms, round_ms,
                      batch * tau / round_ms * 1e3, tau * base_ms / round_ms)


def choose(predictions: list[Prediction]) -> Prediction:
    return max(predictions, key=lambda p: p.tokens_per_s)


# ---------------------------------------------------------------------------------------------- where runs find it
def tuned_path(model: str, method: str, where: str) -> Path:
    """The user cache's record of the tuned budget for this model, method and machine setting."""
    return cache_root() / "tune" / model / f"{method}-{where}.json"


def machine_key(dtype: torch.dtype, device: torch.device, threads: int, invariant: bool,
                engine: str = "specbench") -> str:
    """Where a tuned budget holds: engine (vLLM's own key), dtype, device, threads and our target's invariance."""
    return (("" if engine == "specbench" else f"{engine}-") + f"{dtype_name(dtype)}-{device.type}-{threads}t"
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
        hint = " --engine vllm --concurrency LEVELS" if machine.startswith("vllm-") else ""
        raise UsageError(f"no tuned budget for {method} on {model} ({machine}): run `specbench tune --method {method} "
                         f"--model {model}{hint}` with the same --dtype, --device and --threads first")
    record = json.loads(path.read_text())
    opts = record["opts"]
    levels = sorted(record.get("levels") or [], key=lambda level: level["load"])
    if levels and not (record.get("engine") == "vllm" and record.get("schedule")):  # vLLM's table: K per step, up to opts'
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


def throughput(folder: Path) -> float:
    """A run folder's output tokens per second over its recorded wall time (`scaling.run_throughput`)."""
    return run_throughput(json.loads((folder / "run.json").read_text()), read_table(folder, "prompts"))


def schedule(chosen: dict[int, int]) -> list[list[int]]:
    """vLLM's `num_speculative_tokens_per_batch_size` (vllm/config/speculative.py, 0.32: inclusive
    [range_start, range_end, K] ranges, the first starting at 1) from the draft length chosen at each load level:
    a level's K holds from it up to the next level; vLLM carries the last K to its largest batch
    (vllm/v1/spec_decode/dynamic/utils.py, build_dynamic_sd_schedule_lookup)."""
    loads = sorted(chosen)
    starts = [1, *loads[1:]]
    ends = [*(n - 1 for n in loads[1:]), loads[-1]]
    return [[s, e, chosen[n]] for s, e, n in zip(starts, ends, loads)]
