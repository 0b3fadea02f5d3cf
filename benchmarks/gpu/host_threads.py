"""Does CPU work between eager GPU forwards slow the next forward's launches? (benchmarks/results/readme/h200-check.json records an
H200 run where an eager verify in `specbench run` was much slower than benchmarks/engine.py's, and a suffix round
with a draft much slower than one without.) Random weights in the model's config (no checkpoint needed): one
forward's cost on a host-bound GPU does not depend on the weights' values.

    python benchmarks/gpu/host_threads.py CONFIG.json [--device cuda] [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.engine import timed  # noqa: E402
from specbench_cli.core.target import Target  # noqa: E402
from specbench_cli.core.tree import DraftTree  # noqa: E402


def cpu_work() -> None:
    """What a round's host side may run between forwards: a CPU tensor op big enough to go parallel."""
    torch.ones(1 << 20).cumsum(0).sum()


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM

    device = torch.device(args.device)
    config = AutoConfig.from_pretrained(Path(args.config).parent)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device).eval()
    target = Target(model, device)
    ids = list(range(100, 400))
    target.prefill(ids[:-1])
    threads = torch.get_num_threads()
    rows: dict[str, list[float]] = {}
    for rep in range(3):  # interleaved: every setting once per pass
        for n_threads in (threads, 1):
            torch.set_num_threads(n_threads)
            for between in (False, True):
                for n in (1, 4):
                    def verify(n=n) -> None:
                        logits = target.verify(ids[-1], DraftTree.chain(list(range(500, 500 + n - 1))))
                        logits.argmax(-1).tolist()  # the host reads the round's result, as the loop does

                    after = cpu_work if between else None
                    key = f"threads {n_threads:2d}, CPU op between: {'yes' if between else 'no '}, rows {n}"
                    rows.setdefault(key, []).append(timed(verify, device, args.reps, after=after))
    torch.set_num_threads(threads)
    print(f"eager verify ms (median of {args.reps} per pass; passes: min / median / max), {device}, torch {torch.__version__}")
    for key, v in rows.items():
        print(f"  {key}: {min(v):7.2f} {statistics.median(v):7.2f} {max(v):7.2f}")


if __name__ == "__main__":
    main()
