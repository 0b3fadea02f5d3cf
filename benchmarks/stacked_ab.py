"""Stacked q/k/v and gate/up calls (core/kernels.py, `Stacked`) against one call per linear, interleaved in one run.

Four targets over one bf16 model (plain and batch-invariant, each with the stack on and off): their greedy
tokens from a 512-token context compared, then blocks of decodes (and verifies of 8 and 16 tokens) timed in
turn, so the machine's drift touches every variant alike; medians per block and the ratios' median and range.
CPU only (the stack exists for oneDNN's packed weights); perf_counter.

    python benchmarks/stacked_ab.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specbench_cli.core.target import Target
from specbench_cli.core.tree import DraftTree
from specbench_cli.loading import load_model
from specbench_cli.models import MODELS

CONTEXT = list(range(100, 612))


def target(model: torch.nn.Module, invariant: bool, stack: bool) -> Target:
    t = Target(model, torch.device("cpu"), invariant=invariant)
    t.shared.kernels.stack = stack and t.shared.kernels.stack  # off: each linear its own call
    return t


def greedy(t: Target, n: int = 48) -> list[int]:
    logits, out = t.prefill(CONTEXT, room=1024), []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = t.verify(out[-1], DraftTree.chain([]))[0]
        t.commit([0])
    return out


def median_ms(t: Target, tokens: int, reps: int) -> float:
    """Median ms of a verify of `tokens` tokens (1: a decode, committed each time) after 3 untimed ones."""
    t.prefill(CONTEXT, room=1024)
    times = []
    for i in range(reps + 3):
        t0 = time.perf_counter()
        t.verify(5, DraftTree.chain([7] * (tokens - 1)))
        if tokens == 1:
            t.commit([0])
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--reps", type=int, default=25, help="decodes per block (verifies: 10)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(MODELS[args.model], torch.device("cpu"), torch.bfloat16).model
    with torch.inference_mode():
        variants = {(inv, stack): target(model, inv, stack) for inv in (False, True) for stack in (False, True)}
        if not variants[False, True].shared.kernels.stack:
            raise SystemExit("this machine's probe turned the stack off (a part differs from its own call)")
        for inv in (False, True):
            same = greedy(variants[inv, False]) == greedy(variants[inv, True])
            print(f"{'batch-invariant' if inv else 'plain'}: stacked greedy tokens equal one call each: {same}")
        ms = {key: {n: [] for n in (1, 8, 16)} for key in variants}
        for _ in range(args.blocks):
            for key, t in variants.items():
                for n in ms[key]:
                    ms[key][n].append(median_ms(t, n, args.reps if n == 1 else 10))
        for inv in (False, True):
            name = "batch-invariant" if inv else "plain"
            for n in (1, 8, 16):
                off, on = ms[inv, False][n], ms[inv, True][n]
                ratio = [b / a for a, b in zip(off, on)]
                print(f"{name} {'decode' if n == 1 else f'verify {n}'}: {statistics.median(off):.2f} -> "
                      f"{statistics.median(on):.2f} ms, stacked/one each {statistics.median(ratio):.3f} "
                      f"(range {min(ratio):.3f}-{max(ratio):.3f})")
        ratio = [b / a for a, b in zip(ms[False, True][1], ms[True, True][1])]
        print(f"stacked: batch-invariant / plain decode {statistics.median(ratio):.3f} "
              f"(range {min(ratio):.3f}-{max(ratio):.3f})")


if __name__ == "__main__":
    main()
