"""Benchmark the engine under every number specbench prints, on one model and one prompt, in one run.

1. Verify cost curve c(n) = time of one target forward over n new tokens / time over one token, at a fixed
   context, for a plain Hugging Face forward over a DynamicCache, our eager Target (chain and tree masks) and
   our compiled Target (buckets = the n measured, so no padding).
2. Baseline decode tokens/s: ours eager, ours compiled, transformers `generate()` (dynamic cache) and
   `generate()` with a static cache and a compiled forward; host overhead per round of our eager loop.
3. With --batch 2,4,8,16: the batched verify (`TargetModel.verify`), t(B, n) = one forward over B sequences of n new
   tokens each (chains, each sequence at the same context), as c(B, n) = t(B, n) / t(B, 1) (what a round of n
   tokens per sequence costs beside a batch-B baseline round) and t(B, 1) / t(1, 1) (how a baseline round grows
   with the batch).
4. Achieved bandwidth as gpt-fast defines it (bytes of every parameter but the input embedding table, the
   output head counted even when tied, times tokens/s) and its share of the device's measured read bandwidth
   (`hardware.read_bandwidth`: a sum over a buffer far larger than the last-level cache), the roofline a
   decode that reads every weight once per token cannot beat.

Clocks: CUDA events on GPU (synchronised once per measurement), perf_counter on CPU. Medians over reps.

    python benchmarks/engine.py --device cpu --threads 2                 # eager only, fp32
    python benchmarks/engine.py --device cuda --dtype bfloat16 --compile # the GPU table
    python benchmarks/engine.py --device cpu --threads 2 --dtype bfloat16 --invariant  # what exact bf16 costs
    python benchmarks/engine.py --device cpu --threads 2 --batch 2,4,8,16              # batched verify costs
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from specbench_methods.baseline import Baseline
from specbench_methods.hf_generate import Stamps
from specbench_cli.core.engine import decode_turn
from specbench_cli.core.kernels import keep_one_copy
from specbench_cli.core.target import Target, TargetModel
from specbench_cli.core.tree import DraftTree
from specbench_cli.core.turn import DecodeSettings
from specbench_cli.hardware import read_bandwidth, weight_bytes
from specbench_cli.loading import load_model, resolve_dtype
from specbench_cli.models import get_model_spec, parse_random
from specbench_cli.commands.tune.pricing import random_tree
from specbench_cli.core.dtypes import dtype_name

NS = (1, 2, 4, 8, 16, 32, 64)


def timed(fn: Callable[[], object], device: torch.device, reps: int, warmup: int = 3,
          after: Callable[[], object] | None = None) -> float:
    """Median ms of fn over reps (after warm-up); `after` runs untimed after every call (cache clean-up)."""
    times = []
    for i in range(warmup + reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1e3
        if after:
            after()
        if i >= warmup:
            times.append(ms)
    return statistics.median(times)


@torch.inference_mode()
def verify_curve(model, device, context: int, reps: int, compile_mode: str | None,
                 invariant: bool = False, sizes: tuple[int, ...] = NS, ours_only: bool = False) -> dict[str, dict[int, float]]:
    """c(n) of a plain transformers forward and of our targets; `ours_only`: ours alone, on one copy of each weight
    (`kernels.keep_one_copy`: what lets an 8 B bf16 target fit beside nothing else on a 24 GiB machine)."""
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    rng = random.Random(0)
    ids = [rng.randrange(vocab) for _ in range(context + max(sizes))]
    curves: dict[str, dict[int, float]] = {}

    if not ours_only:
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([ids[:context]], device=device), past_key_values=cache, use_cache=True)
        curves["hf forward"] = {
            n: timed(lambda n=n: model(input_ids=torch.tensor([ids[context:context + n]], device=device),
                                       position_ids=torch.arange(context, context + n, device=device)[None],
                                       past_key_values=cache, use_cache=True),
                     device, reps, after=lambda: cache.crop(context - cache.get_seq_length()))  # negative: drop that many
            for n in sizes}

    eager = Target(model, device)
    if ours_only:
        keep_one_copy(model, eager.shared.kernels)
    eager.prefill(ids[:context - 1])
    curves["ours eager chain"] = {n: timed(lambda n=n: eager.verify(ids[context - 1], DraftTree.chain(ids[context:context + n - 1])),
                                           device, reps) for n in sizes}
    trees = {n: random_tree(n - 1, vocab, rng) for n in sizes}
    curves["ours eager tree"] = {n: timed(lambda n=n: eager.verify(ids[context - 1], trees[n]), device, reps) for n in sizes}
    if invariant:  # rows computed as one-token decodes (a tree's path is verified again in the loop: not here)
        exact = Target(model, device, invariant=True)
        exact.prefill(ids[:context - 1])
        curves["ours invariant chain"] = {n: timed(lambda n=n: exact.verify(ids[context - 1], DraftTree.chain(ids[context:context + n - 1])),
                                                   device, reps) for n in sizes}
        curves["ours invariant tree"] = {n: timed(lambda n=n: exact.verify(ids[context - 1], trees[n]), device, reps)
                                         for n in sizes}
    if compile_mode:
        compiled = Target(model, device, compile=compile_mode, buckets=sizes)
        compiled.plan(context + 2 * max(sizes))
        compiled.warm_up()
        compiled.prefill(ids[:context - 1], room=2 * max(sizes))  # inside the planned cache: no recompile
        curves["ours compiled tree"] = {n: timed(lambda n=n: compiled.verify(ids[context - 1], trees[n]), device, reps)
                                        for n in sizes}
    return curves


BATCH_NS = (1, 2, 4, 8, 16)


@torch.inference_mode()
def batch_curve(model, device, context: int, reps: int, sizes: list[int]) -> dict[int, dict[int, float]]:
    """t(B, n) ms: one batched verify of B sequences, each an (n-1)-token chain after its root, at `context`."""
    vocab = model.config.vocab_size
    rng = random.Random(1)
    out = {}
    for size in [1, *sizes]:
        batch = TargetModel(model, device, slots=size)
        batch.plan(context + 2 * max(BATCH_NS))
        seqs = [[rng.randrange(vocab) for _ in range(context + max(BATCH_NS))] for _ in range(size)]
        for target, ids in zip(batch.slots, seqs):
            target.prefill(ids[:context - 1])
        out[size] = {n: timed(lambda n=n: batch.verify([(t, ids[context - 1], DraftTree.chain(ids[context:context + n - 1]), None)
                                                        for t, ids in zip(batch.slots, seqs)]), device, reps) for n in BATCH_NS}
    return out


@torch.inference_mode()
def decode_rates(loaded, device, prompt: list[int], new: int, compile_mode: str | None,
                 invariant: bool = False, ours_only: bool = False) -> dict[str, dict]:
    """Baseline tokens/s (decode only, first token excluded) for our loop and for generate()."""
    model = loaded.model
    settings = DecodeSettings(new, 0.0, frozenset())  # no stop: every engine decodes exactly `new` tokens
    rows: dict[str, dict] = {}
    outputs = {}
    for name, mode in (("ours eager", None), ("ours eager invariant", None), ("ours compiled", compile_mode)):
        if (name == "ours compiled" and not mode) or (name == "ours eager invariant" and not invariant):
            continue
        target = Target(model, device, compile=mode, invariant=name == "ours eager invariant")
        if mode:
            target.plan(len(prompt) + new)
            target.warm_up((1,))
        method = Baseline(Baseline.Options(), loaded)
        decode_turn(target, method, prompt, settings)  # warm-up
        result = decode_turn(target, method, prompt, settings)
        wall = sum(r.phases["wall"] for r in result.rounds)
        verify = sum(r.phases["verify"] for r in result.rounds)
        rows[name] = {"tok/s": (len(result.output_ids) - 1) / (result.decode_ms / 1e3),
                      "host overhead / round": 1 - verify / wall if wall else float("nan")}
        outputs[name] = result.output_ids
    for name, static in (("hf generate", False), ("hf generate static+compile", True)):
        if (static and not compile_mode) or ours_only:
            continue
        rows[name] = {"tok/s": generate_rate(model, device, prompt, new, static), "host overhead / round": float("nan")}
    for name in ("ours compiled", "ours eager invariant"):
        if name in outputs:
            rows[name]["same tokens as eager"] = outputs[name] == outputs["ours eager"]
    return rows


def versus_vllm(loaded, device, prompt: list[int], new: int, reps: int, log: Path) -> dict | None:
    """Our plain eager decode and vLLM's CPU engine on the same prompt ids, dtype and threads, interleaved
    repetition by repetition (vLLM waits idle in its own process while ours decodes, and the other way round);
    each side's decode tok/s with the first token excluded, by perf_counter in its own process. None where no
    Python with vLLM is found (`scripts/setup-vllm.sh`)."""
    import os

    from specbench_cli.core.errors import UsageError
    from specbench_cli.engines.options import engine_python
    from specbench_cli.engines.vllm import ENV_DEFAULTS, Launch, Worker
    from specbench_cli.loading import checkpoint_location, random_folder

    if device.type != "cpu":
        return None
    try:
        python = engine_python(None, dict(os.environ))
    except UsageError:
        return None
    threads = str(torch.get_num_threads())
    env = {k: os.environ.get(k, v) for k, v in {**ENV_DEFAULTS, "OMP_NUM_THREADS": threads}.items()}
    dtype = dtype_name(loaded.model.dtype)
    args = {"model": checkpoint_location(loaded.spec), "dtype": dtype, "seed": 0}
    weights = parse_random(loaded.spec.target)
    if weights is not None:  # vLLM loads the same weights written as a folder; a Qwen3 model's whole context
        # (40960) does not fit vLLM's default CPU KV cache, and the benchmark's prompt needs a fraction of it
        args |= {"model": str(random_folder(weights, loaded.model.dtype)), "max_model_len": 8192}
    launch = Launch(python, args, env, None)
    target, method = Target(loaded.model, device), Baseline(Baseline.Options(), loaded)
    settings = DecodeSettings(new, 0.0, frozenset())
    ours, theirs, same = [], [], []
    with Worker(launch, log) as worker:
        for rep in range(reps + 1):  # the first of each: warm-up
            result = decode_turn(target, method, prompt, settings)
            worker.submit({"id": str(rep), "prompt_ids": prompt, "max_tokens": new, "temperature": 0.0, "seed": 0,
                           "stop_ids": [], "ignore_eos": True})
            done = worker.next_done()
            steps = done["steps"]  # [(perf_counter, new tokens)] per engine step
            if rep:
                ours.append((len(result.output_ids) - 1) / (result.decode_ms / 1e3))
                theirs.append(sum(k for _, k in steps[1:]) / (steps[-1][0] - steps[0][0]))
                pairs = list(zip(done["output_ids"], result.output_ids))
                same.append(next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs)))
    ratios = sorted(a / b for a, b in zip(ours, theirs))
    return {"ours tok/s": statistics.median(ours), "vllm tok/s": statistics.median(theirs), "ratios": ratios,
            "vllm version": worker.ready.get("version"), "threads": threads, "tokens agreeing": min(same)}


def generate_rate(model, device, prompt: list[int], new: int, static: bool) -> float:
    """Decode tokens/s of generate(): (new - 1) tokens over the time after the first one (a streamer stamps it)."""
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)
    if static:
        kwargs.update(cache_implementation="static")
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    ids = torch.tensor([prompt], device=device)
    try:
        for _ in range(2):  # the first call compiles (static) or warms the allocator
            model.generate(ids, **kwargs)
        stamps = Stamps()
        model.generate(ids, streamer=stamps, **kwargs)
    finally:
        if static:
            del model.forward  # back to the class's forward
    times = stamps.times  # ns, one per generated token (the prompt push is skipped)
    return (len(times) - 1) / ((times[-1] - times[0]) / 1e9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--target", default=None, help="as `specbench run --target`: a folder, or random:NAME[:SEED]")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--compile", action="store_true", help="also the compiled Target and generate() with a static cache")
    ap.add_argument("--invariant", action="store_true", help="also the batch-invariant Target (core.target)")
    ap.add_argument("--sizes", default=",".join(map(str, NS)),
                    help="verify sizes n of the c(n) table (each one a compiled bucket with --compile, compiled on its own)")
    ap.add_argument("--batch", default="", help="batch sizes for the batched verify table, e.g. 2,4,8,16")
    ap.add_argument("--batch-only", action="store_true", help="with --batch: that table alone")
    ap.add_argument("--ours-only", action="store_true", help="our eager target alone, keeping one copy of each "
                    "weight (no transformers forward or generate(), no compiled or invariant target): an 8 B target "
                    "in bf16 on a 24 GiB machine")
    ap.add_argument("--json", type=Path, default=None, help="write the numbers here too")
    ap.add_argument("--vllm-reps", type=int, default=5,
                    help="our plain decode against vLLM's CPU engine, interleaved this many times, when a Python with "
                         "vLLM is found (scripts/setup-vllm.sh; a random target as its folder, not with "
                         "--ours-only); 0: skip")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = resolve_dtype(args.dtype, device).dtype
    loaded = load_model(get_model_spec(args.model, args.target), device, dtype)
    mode = ("reduce-overhead" if device.type == "cuda" else "inductor") if args.compile else None
    console = Console(width=120)
    clock = "CUDA events" if device.type == "cuda" else "perf_counter"
    where = f"{loaded.spec.name} {dtype_name(dtype)} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}"

    sizes = tuple(sorted({1, *(int(n) for n in args.sizes.split(","))}))  # t(1) is every ratio's denominator
    if args.ours_only and (args.compile or args.invariant or args.batch):
        ap.error("--ours-only times our plain eager target alone: drop --compile, --invariant and --batch")
    curves = {} if args.batch_only else verify_curve(loaded.model, device, args.context, args.reps, mode, args.invariant,
                                                     sizes, args.ours_only)
    table = Table(title=f"verify cost c(n) = t(n) / t(1), context {args.context}; t(1) ms in the last column ({where}, {clock})")
    table.add_column("forward")
    for n in sizes:
        table.add_column(f"n={n}", justify="right")
    table.add_column("t(1) ms", justify="right")
    for name, curve in curves.items():
        table.add_row(name, *(f"{curve[n] / curve[1]:.2f}" for n in sizes), f"{curve[1]:.3f}")
    if "hf forward" in curves:
        hf = curves["hf forward"]
        table.add_row("eager chain / hf", *(f"{curves['ours eager chain'][n] / hf[n]:.2f}" for n in sizes), "")
    if curves:
        console.print(table)

    batched = {}
    if args.batch:
        batched = batch_curve(loaded.model, device, args.context, args.reps, [int(b) for b in args.batch.split(",")])
        table = Table(title=f"batched verify, context {args.context}: c(B, n) = t(B, n) / t(B, 1); last columns "
                            f"t(B, 1) ms and t(B, 1) / t(1, 1) ({where}, {clock})")
        table.add_column("B")
        for n in BATCH_NS:
            table.add_column(f"n={n}", justify="right")
        table.add_column("t(B, 1) ms", justify="right")
        table.add_column("vs B=1", justify="right")
        for size, curve in batched.items():
            table.add_row(str(size), *(f"{curve[n] / curve[1]:.2f}" for n in BATCH_NS), f"{curve[1]:.2f}",
                          f"{curve[1] / batched[1][1]:.2f}")
        console.print(table)
    if args.batch_only:
        if args.json:
            args.json.write_text(json.dumps({"where": where, "clock": clock, "batched": batched}, indent=2))
        return

    prompt = loaded.encode_chat([{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in a bottle."}])
    rates = decode_rates(loaded, device, prompt, args.new, mode, args.invariant, args.ours_only)
    size = weight_bytes(loaded.model)
    peak = read_bandwidth(device)
    table = Table(title=f"baseline decode, {args.new} new tokens, prompt {len(prompt)} tokens ({where}, {clock}); "
                        f"weights {size / 1e6:.0f} MB, measured read bandwidth {peak / 1e9:.0f} GB/s (roofline "
                        f"{peak / size:.0f} tok/s)")
    for col in ("engine", "tok/s", "× hf generate", "bandwidth GB/s", "share of read roofline", "host overhead / round"):
        table.add_column(col, justify="right")
    base = rates["hf generate"]["tok/s"] if "hf generate" in rates else float("nan")
    for name, row in rates.items():
        overhead = row["host overhead / round"]
        table.add_row(name, f"{row['tok/s']:.1f}", f"{row['tok/s'] / base:.2f}", f"{size * row['tok/s'] / 1e9:.1f}",
                      f"{size * row['tok/s'] / peak:.1%}", "—" if overhead != overhead else f"{overhead:.1%}")
    console.print(table)
    for name in ("ours compiled", "ours eager invariant"):
        if "same tokens as eager" in rates.get(name, {}):
            console.print(f"{name.removeprefix('ours ')} output identical to eager: {rates[name]['same tokens as eager']}")
    log = Path(tempfile.gettempdir()) / "specbench-engine-vllm.log"
    compare = args.vllm_reps and not args.ours_only  # a random target's folder is drawn beside ours: two copies
    vllm = versus_vllm(loaded, device, prompt, args.new, args.vllm_reps, log) if compare else None
    if vllm:
        r = vllm["ratios"]
        console.print(f"vLLM {vllm['vllm version']} CPU engine, same prompt ids, {dtype_name(dtype)}, "
                      f"{vllm['threads']} threads, interleaved {len(r)}x: ours plain eager {vllm['ours tok/s']:.1f} "
                      f"tok/s, vLLM {vllm['vllm tok/s']:.1f} tok/s; ours / vLLM median {r[len(r) // 2]:.2f} (range "
                      f"{r[0]:.2f}-{r[-1]:.2f}); the two agree on the first {vllm['tokens agreeing']} of {args.new} tokens "
                      f"(its log: {log})", highlight=False, soft_wrap=True)
    elif compare and device.type == "cpu":
        console.print("no vLLM found (bash scripts/setup-vllm.sh): no comparison with vLLM's CPU engine")
    if args.json:
        args.json.write_text(json.dumps({"where": where, "clock": clock, "curves": curves, "rates": rates,
                                         "batched": batched, "vllm": vllm,
                                         "weight_bytes": size, "read_bandwidth": peak}, indent=2, default=str))


if __name__ == "__main__":
    main()
