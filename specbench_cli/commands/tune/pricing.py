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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from specbench_cli.analysis.oracles import round_starts
from specbench_cli.budgets import label
from specbench_cli.analysis.scaling import run_throughput
from specbench_cli.records import read_table
from specbench_cli.core.target import Target, TargetModel
from specbench_cli.core.timing import sync
from specbench_cli.core.tree import DraftTree
from specbench_cli.models import cache_root

# Verify sizes whose cost is measured; c(n) between them is interpolated linearly. Every multiple of 8 and the size
# after it: where a batch-invariant target's GEMMs take rows 8 at a time (`core.target.ROW_BLOCK`: its start-up
# probe found one call unsafe on that machine), its curve steps
# up there (measured on the embedded model in bf16: a DART tree of 9 rows cost far more than 8 rows), and a line
# from 8 to 12 would price 9 rows too low (DART's total=8 was predicted faster than it ran before these points).
COST_ROWS = (1, 2, 3, 4, 6, 8, 9, 12, 16, 17, 24, 25, 32, 33, 40, 41, 48, 49, 56, 57, 64)


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
# (verifies of 8 and 16 rows cheaper).
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


def throughput(folder: Path) -> float:
    """A run folder's output tokens per second over its recorded wall time (`scaling.run_throughput`)."""
    return run_throughput(json.loads((folder / "run.json").read_text()), read_table(folder, "prompts"))
