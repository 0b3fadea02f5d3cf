"""Benchmark: our baseline vs transformers generate(), suffix and pld τ and speedup, harness overhead.

Runs every method on the same prompts (one results root, same machine) and prints one table. Host overhead
per round is the round's wall time minus the target's verify forward, as a share of the wall time.

    python benchmarks/engine_overhead.py --limit 8 --max-new-tokens 128   # spec-bench summarization + rag
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from specbench_cli.analysis.metrics import summarise
from specbench_cli.records import read_table
from specbench_cli.inputs import RunConfig
from specbench_cli.planning import plan
from specbench_cli.run_folder import record_run

METHODS = ("baseline", "hf-generate", "suffix", "pld")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--categories", default="summarization,rag")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--root", type=Path, default=Path("results") / f"bench-{dt.datetime.now():%Y%m%d-%H%M%S}")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    console = Console()
    for method in METHODS:
        config = RunConfig(method=method, model=args.model, dataset="spec-bench", categories=args.categories.split(","),
                           limit=args.limit, max_new_tokens=args.max_new_tokens, warmup=1,
                           out=args.root / method)
        record_run(plan(config, dict(os.environ)), console)

    base = read_table(args.root / "baseline", "prompts")
    table = Table(title=f"{args.model}, spec-bench {args.categories}, {args.limit} prompts, {args.max_new_tokens} new tokens, "
                        f"{args.threads} threads")
    for col in ("method", "τ", "decode tok/s", "speedup vs baseline", "lossless", "host overhead / round"):
        table.add_column(col, justify="right")
    for method in METHODS:
        prompts, rounds = read_table(args.root / method, "prompts"), read_table(args.root / method, "rounds")
        overall = summarise(prompts, "subtask", base).iloc[-1]
        same = (prompts.sort_values(["prompt_id", "turn"]).output_hash.values
                == base.sort_values(["prompt_id", "turn"]).output_hash.values).mean()
        overhead = "—" if method == "hf-generate" else f"{(1 - rounds.verify_ms.sum() / rounds.wall_ms.sum()) * 100:.1f}%"
        table.add_row(method, f"{overall.tau:.2f}", f"{overall.tokens_per_s:.2f}",
                      f"{overall.speedup:.2f}×" if method != "baseline" else "1.00×", f"{same * 100:.0f}%", overhead)
    console.print(table)
    console.print(f"runs under {args.root}")


if __name__ == "__main__":
    main()
