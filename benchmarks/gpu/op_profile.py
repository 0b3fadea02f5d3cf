"""Where a round's time goes, operator by operator: `specbench run` of one method on a few prompts under
torch.profiler, each round phase (core.timing.PhaseClock) marked as a record_function range.

Two questions from an H200 call (its numbers in benchmarks/results/readme/h200-check.json) need it: why EAGLE-3's draft phase was
slow there and grew with the context, where on the CPU it takes about the same time whatever the context; and
why an eager verify inside a run was much slower than benchmarks/engine.py's. It prints,
per phase, the host time, the device time and the count of host-device synchronisations, copies and cuDNN
attention calls inside it, then the operators with the most self host time and self device time.

    python benchmarks/gpu/op_profile.py --method eagle3,baseline --limit 2 --max-new-tokens 48 [--category summarization]
        [--device cuda] [--out DIR] [--opt depth=3 ...]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from rich.console import Console
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from specbench_cli.core import timing  # noqa: E402
from specbench_cli.inputs import RunConfig  # noqa: E402
from specbench_cli.loading import load_model  # noqa: E402
from specbench_cli.planning import plan  # noqa: E402
from specbench_cli.run_folder import record_run  # noqa: E402

# Host-side events that wait for the device or move data across: what a host-bound loop must not do per step.
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "aten::_local_scalar_dense",
         "cudaMemcpyAsync", "cudaMemcpy")
CUDNN_SDPA = "aten::_scaled_dot_product_cudnn_attention"  # where cuDNN builds a plan for a shape it has not seen


def marked_phases() -> None:
    """PhaseClock.phase, each phase also a profiler range named `phase:<name>` (the core is left as it is)."""
    original = timing.PhaseClock.phase

    @contextlib.contextmanager
    def phase(self, name: str):
        with record_function(f"phase:{name}"), original(self, name):
            yield

    timing.PhaseClock.phase = phase


def device_time(event) -> float:
    """An event's own device time in µs (the attribute's name changed across torch releases)."""
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, attr):
            return float(getattr(event, attr))
    return 0.0


def inside(events, ranges) -> dict[str, dict[str, float]]:
    """Per phase: host µs, device µs of the kernels launched inside it, and counts of the SYNCS events."""
    by_thread = defaultdict(list)
    for r in ranges:
        by_thread[r.thread].append(r)
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        for r in by_thread.get(e.thread, ()):
            if r.time_range.start <= e.time_range.start and e.time_range.end <= r.time_range.end and e is not r:
                row = out[r.name]
                if e.name in SYNCS or e.name == CUDNN_SDPA:
                    row[e.name] += 1
                row["device µs"] += device_time(e)
    for r in ranges:
        out[r.name]["host µs"] += r.time_range.elapsed_us()
        out[r.name]["count"] += 1
    return out


def report(method: str, chosen, prof, limit: int, tokens: int, top: int) -> str:
    """The per-phase table and the top operators of one method's profile."""
    events = prof.events()
    table = inside(events, [e for e in events if e.name.startswith("phase:")])
    lines = [f"{method} on {chosen.device} ({chosen.dtype}), {limit} prompts x {tokens} tokens (the warm-up prompt "
             f"included); per round phase, means:"]
    for name, row in sorted(table.items()):
        n = max(row.pop("count"), 1)
        host, dev = row.pop("host µs", 0.0), row.pop("device µs", 0.0)
        syncs = ", ".join(f"{k} {v / n:.1f}" for k, v in sorted(row.items()))
        lines.append(f"  {name:22s} x{int(n):5d}: host {host / n / 1e3:8.2f} ms, device {dev / n / 1e3:8.2f} ms "
                     f"a call; per call: {syncs or 'no syncs or copies'}")
    averages = prof.key_averages()
    lines.append(averages.table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=60))
    if chosen.device.type == "cuda":
        lines.append(averages.table(sort_by="self_cuda_time_total", row_limit=top, max_name_column_width=60))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="eagle3,baseline", help="comma list: one profile each, one loaded model")
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--category", action="append", default=[], help="Spec-Bench categories (repeatable); default all")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None, help="folder for each method's run and tables (<method>/)")
    ap.add_argument("--trace", action="store_true", help="also each method's Chrome trace (<method>/trace.json: "
                    "~80 MB for eagle3 over a prompt and the warm-up on a CPU)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--opt", action="append", default=[], help="an option of the (one) method profiled, as profile's --opt: depth=3 (repeatable)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out or Path(tempfile.mkdtemp(prefix="op_profile-"))
    console = Console(width=200)
    marked_phases()
    model = None
    for method in args.method.split(","):
        config = RunConfig(method=method, categories=args.category, limit=args.limit, max_new_tokens=args.max_new_tokens,
                           dtype=args.dtype, device=args.device, out=out / method / "run", replay=False,
                           threads=args.threads, opts=args.opt)
        chosen = plan(config, {})
        model = model or load_model(chosen.spec, chosen.device, chosen.dtype)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if chosen.device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            record_run(chosen, console, model)
        text = report(method, chosen, prof, args.limit, args.max_new_tokens, args.top)
        print(text)
        (out / method / "op_profile.txt").write_text(text + "\n")
        if args.trace:
            prof.export_chrome_trace(str(out / method / "trace.json"))
            print(f"trace: {out / method / 'trace.json'}")


if __name__ == "__main__":
    main()
