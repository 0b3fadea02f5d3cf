"""What a seed's method would do on this machine: EAGLE-3 and DFlash on a seeds-sized target with random weights,
at the acceptance their papers report, beside the baseline, interleaved prompt by prompt.

A projection, never a measurement of the method. The target and the drafters have random weights of the real
architectures (`--target random:NAME`, `--drafter NAME=random`), so every forward costs what the released
checkpoints' cost; the accept decision alone is replaced (`--acceptance METHOD.synthetic:RATE`), with a constant
per-position rate solved so that τ = 1 + RATE + … + RATE^K equals the paper's τ for a draft of K tokens. Both
drafts are chains, so that formula is what the run gives (a tree's first-child path is as long as random scores
make it):
- EAGLE-3: the chain vLLM drafts for the paper's depth 8 (K = 9: depth=8, top_k=1, total_token=10). The paper's
  τ is its 60-node tree's; a chain of 9 at that τ is an optimistic chain;
- DFlash: its block of 16 (K = 15), as the paper runs it.

Paper τ: WhiFlash, Table 9 (Qwen3-8B, H100, greedy; EAGLE-3 depth 8 / top-k 10 / 60 tokens, DFlash block 16), as
transcribed in docs/models.md ("What a seed's method would do here"). Clock: the runs' own (perf_counter on a
CPU, CUDA events on a GPU; --compile compiles the target's verify sizes and the drafters' steps). Writes a record
(command, commit, machine, date, per method: paper τ, rate, τ measured, tokens/s and speedup with their 95 %
intervals, mean phase ms a round) with --record.

    python benchmarks/projection.py --target random:qwen3-8b --row MT-Bench --limit 8 --max-new-tokens 64 \\
        --out /tmp/projection --record benchmarks/results/projection/qwen3-8b-mt-bench-cpu.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.record import phases_ms, tau, write_record  # noqa: E402
from specbench_cli.analysis import intervals  # noqa: E402
from specbench_cli.analysis.results import load  # noqa: E402

import torch  # noqa: E402

# WhiFlash, Table 9: acceptance length per dataset on Qwen3-8B (docs/models.md quotes the rows used here)
PAPER_TAU = {"MT-Bench": {"eagle3": 5.17, "dflash": 4.26}, "GSM8K": {"eagle3": 6.21, "dflash": 6.48}}
DRAFT_TOKENS = {"eagle3": 9, "dflash": 15}  # K: the chain each method drafts here (module docstring)
PHASES = ("draft_ms", "draft_head_ms", "verify_ms", "accept_ms", "commit_ms", "wall_ms")  # rounds.parquet, per round
BUDGET = {"eagle3": ("eagle3.depth=8", "eagle3.top_k=1", "eagle3.total_token=10"), "dflash": ()}


def rate_for(tau: float, k: int) -> float:
    """The constant per-position rate r with 1 + r + … + r^k = tau (bisection; tau in [1, k + 1])."""
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if sum(mid ** i for i in range(k + 1)) < tau else (low, mid)
    return round(low, 4)


def command(a: argparse.Namespace, rates: dict[str, float]) -> list[str]:
    methods = ["baseline", *rates]
    cmd = [sys.executable, "-m", "specbench_cli", "run", "--target", a.target, "--dtype", a.dtype,
           "--method", ",".join(methods), "--dataset", a.dataset, "--limit", str(a.limit),
           "--max-new-tokens", str(a.max_new_tokens), "--warmup", "1", "--no-replay", "--threads", str(a.threads),
           "--device", a.device, "--out", str(a.out)]
    if a.compile:  # the target's forwards at the chains' verify sizes (baseline 1, EAGLE-3 10, DFlash 16)
        cmd += ["--compile", "--compile-buckets", a.compile_buckets]
    for method, rate in rates.items():
        cmd += [*(x for opt in BUDGET[method] for x in ("--opt", opt)), "--acceptance", f"{method}.synthetic:{rate}"]
    return cmd


def summary(out: Path, paper: dict[str, float], rates: dict[str, float]) -> dict:
    """Per method: paper τ, rate, measured τ, tokens/s and speedup over the run's baseline with intervals, and the
    mean ms a round of each phase."""
    results = load([out])
    rows = {}
    for g in results.groups:
        method = g.info["settings"]["method"]
        p = g.prompts
        rate = intervals.mean_interval(p)
        row = {"tau": round(tau(p), 3),
               "tokens_per_s": round(rate.value, 3), "tokens_per_s_95": [round(rate.low, 3), round(rate.high, 3)],
               "label": g.label}
        if method != "baseline":
            speedup = intervals.speedup_interval(p, results.baseline_for(g).prompts, True)
            row |= {"paper_tau": paper[method], "draft_tokens": DRAFT_TOKENS[method], "synthetic_rate": rates[method],
                    "speedup": round(float(speedup.value), 3), "speedup_95": [round(speedup.low, 3), round(speedup.high, 3)]}
        row["phases_ms"] = phases_ms(out / method, PHASES, digits=1)
        rows[method] = row
    return rows


def clock(out: Path) -> str:
    """The clock the runs timed their rounds with, as run.json names it."""
    return str(json.loads((out / "baseline" / "run.json").read_text()).get("clock", "unknown"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="random:qwen3-8b")
    ap.add_argument("--row", default="MT-Bench", choices=sorted(PAPER_TAU), help="the paper row whose τ is set")
    ap.add_argument("--methods", default="eagle3,dflash")
    ap.add_argument("--dataset", default="spec-bench")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="as `run --device` (on CUDA the rounds are timed by CUDA events)")
    ap.add_argument("--compile", action="store_true", help="compile the target and the drafters (`run --compile`)")
    ap.add_argument("--compile-buckets", default="1,16", help="with --compile: the verify sizes compiled")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--summary-only", action="store_true", help="summarise a finished --out without running")
    ap.add_argument("--record", type=Path)
    a = ap.parse_args()
    paper = PAPER_TAU[a.row]
    rates = {m: rate_for(paper[m], DRAFT_TOKENS[m]) for m in a.methods.split(",")}
    cmd = command(a, rates)
    if not a.summary_only:
        subprocess.run(cmd, check=True)
    rows = summary(a.out, paper, rates)
    for method, row in rows.items():
        print(method, row)
    if a.record:
        write_record(a.record, f"projection, not a measurement: {', '.join(rates)} on {a.target} at the τ WhiFlash "
                     f"Table 9 reports on Qwen3-8B for {a.row} (synthetic acceptance on chains), beside the baseline, "
                     f"interleaved; {a.limit} {a.dataset} prompts x {a.max_new_tokens} tokens",
                     clock(a.out), torch.device(a.device),
                     run_command=" ".join(["specbench", *cmd[3:]]), paper_row=a.row, methods=rows)


if __name__ == "__main__":
    main()
