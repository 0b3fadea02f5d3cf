"""One change to the CPU engine's kernels, off against on, interleaved in one run.

`--change stack`: q/k/v and gate/up as one stacked call each (core/kernels.py, `Stacked`) against one call per
linear. `--change row-attention`: the row attention kernel (core/row_attention.py) against the PyTorch forms
it replaced (`core.attention`: a decode's grouped matmuls, a batch-invariant verify's `exact_attention`).
`--change decoder-layers`: every layer in one C++ call (core/decoder_layers.py) against the layers as PyTorch
operators (both with the row kernel). `--change fp32-kernels`: a float32 model, the reference path (MKL's sgemm,
PyTorch's attention and layers; SPECBENCH_FP32_KERNELS=0) against the default (packed oneDNN GEMMs, the row
kernel, the one-call layers; plain targets only, so its batch-invariant pair is the same path twice).

Four targets over one bf16 model (float32 for fp32-kernels), plain and batch-invariant, each with the change off
and on: their greedy tokens from a 512-token context compared, then blocks of decodes (and verifies of 8, 16 and
64 tokens) timed in turn, so the machine's drift touches every variant alike; medians per block and the ratios'
median and range, and with the change on, the batch-invariant target's cost over the plain one's. CPU only;
perf_counter.

    python benchmarks/kernel_ab.py --change row-attention --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from specbench_cli.core.target import Target
from specbench_cli.core.tree import DraftTree
from specbench_cli.loading import load_model
from specbench_cli.models import MODELS

CONTEXT = list(range(100, 612))


# the environment switch of each change, and its value with the change off and on (None: unset)
SWITCHES = {"row-attention": ("SPECBENCH_ROW_ATTENTION", "0", None),
            "decoder-layers": ("SPECBENCH_DECODER_LAYERS", "0", None),
            "fp32-kernels": ("SPECBENCH_FP32_KERNELS", "0", None)}


def target(model: torch.nn.Module, invariant: bool, change: str, on: bool) -> Target:
    switch, off_value, on_value = SWITCHES.get(change, (None, None, None))
    value = on_value if on else off_value
    if switch and value is not None:  # read when a target is made
        os.environ[switch] = value
    try:
        t = Target(model, torch.device("cpu"), invariant=invariant)
    finally:
        if switch:
            os.environ.pop(switch, None)
    if change == "stack":
        t.shared.kernels.stack = on and t.shared.kernels.stack  # off: each linear its own call
    return t


def is_on(t: Target, change: str) -> bool:
    if change in ("decoder-layers", "fp32-kernels"):
        return t.shared.layers == "one call"
    return t.shared.kernels.stack if change == "stack" else t.shared.attention == "row kernel"


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
    ap.add_argument("--change", choices=("stack", *SWITCHES), required=True, help="what is turned off and on")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--reps", type=int, default=25, help="decodes per block (verifies: 10, 64 tokens: 4)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.change == "fp32-kernels" else torch.bfloat16
    model = load_model(MODELS[args.model], torch.device("cpu"), dtype).model
    sizes = (1, 8, 16, 64)
    with torch.inference_mode():
        variants = {(inv, on): target(model, inv, args.change, on) for inv in (False, True) for on in (False, True)}
        if not is_on(variants[False, True], args.change):
            raise SystemExit(f"{args.change} is off on this machine (a probe or the kernel's build turned it off)")
        for inv in (False, True):
            same = greedy(variants[inv, False]) == greedy(variants[inv, True])
            print(f"{'batch-invariant' if inv else 'plain'}: greedy tokens with {args.change} equal those without: {same}")
        ms = {key: {n: [] for n in sizes} for key in variants}
        for _ in range(args.blocks):
            for key, t in variants.items():
                for n in sizes:
                    ms[key][n].append(median_ms(t, n, args.reps if n == 1 else 10 if n < 64 else 4))

        def line(name: str, before: list[float], after: list[float], what: str) -> None:
            ratio = [b / a for a, b in zip(before, after)]
            print(f"{name}: {statistics.median(before):.2f} -> {statistics.median(after):.2f} ms, {what} "
                  f"{statistics.median(ratio):.3f} (range {min(ratio):.3f}-{max(ratio):.3f})")

        for inv in (False, True):
            for n in sizes:
                line(f"{'batch-invariant' if inv else 'plain'} {'decode' if n == 1 else f'verify {n}'}",
                     ms[inv, False][n], ms[inv, True][n], "on/off")
        for on in (False, True):
            for n in sizes:
                line(f"{args.change} {'on' if on else 'off'}, plain -> batch-invariant "
                     f"{'decode' if n == 1 else f'verify {n}'}", ms[False, on][n], ms[True, on][n], "invariant/plain")


if __name__ == "__main__":
    main()
