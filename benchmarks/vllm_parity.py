"""Our engine against vLLM's, method by method: every method both engines run, on the same prompt ids, dtype and
threads, interleaved engine against engine prompt by prompt (`interleave.record_plans`: the two runs of a method
share one pairing), reported as ours/vLLM tokens/s with its paired 95 % interval (`analysis/intervals.py`).

Each method's two runs are one paired list: our target is loaded once for every method, vLLM starts an engine per
method (a vLLM engine serves one speculative config). The budgets are each engine's defaults for the method on
this machine, as `run` drafts them (ours: a CPU budget where one is recorded, `budgets.CPU_BUDGETS`; vLLM's as
`engines/vllm_methods.py` maps the paper's options), or `tune`'s with --tuned. Clock: each run's own
(perf_counter on a CPU). Writes a record (command, commit, machine, date, numbers, and our phases' mean ms a round:
vLLM exposes none) with --record; --resume continues the runs already under --out.

    python benchmarks/vllm_parity.py --methods baseline,suffix,pld,eagle3,dflash,sps --limit 16 \\
        --max-new-tokens 256 --record benchmarks/results/vllm-parity/cpu-float32.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.record import phases_ms, tau, write_record  # noqa: E402
from specbench_cli.analysis import intervals  # noqa: E402
from specbench_cli.commands.interleave import member_opts, record_plans  # noqa: E402
from specbench_cli.engines.vllm import target_folder  # noqa: E402
from specbench_cli.inputs import RunConfig, use_threads  # noqa: E402
from specbench_cli.options import options_record  # noqa: E402
from specbench_cli.planning import loaded_target, plan  # noqa: E402
from specbench_cli.records import read_table  # noqa: E402

ENGINES = ("specbench", "vllm")
PHASES = ("draft_ms", "draft_head_ms", "verify_ms", "wall_ms")


def configs(method: str, a: argparse.Namespace) -> list[RunConfig]:
    """The method's run in each engine, into <out>/<method>/<engine>."""
    common = RunConfig(method=method, target=a.target, dataset=a.dataset, limit=a.limit, max_new_tokens=a.max_new_tokens,
                       dtype=a.dtype, device="cpu", warmup=a.warmup, threads=a.threads, tuned=a.tuned,
                       cpu_budget=not a.paper_budget, batch_invariant=a.batch_invariant, replay=False)
    return [dataclasses.replace(common, engine=engine, out=a.out / method / engine,
                                opts=[*a.opt_for[method], *(a.ours_opt_for[method] if engine == "specbench" else [])],
                                engine_args=a.engine_arg if engine == "vllm" else [],
                                resume=a.resume and (a.out / method / engine / "run.json").is_file())
            for engine in ENGINES]


def measure(method: str, model, a: argparse.Namespace, console: Console) -> dict:
    """One method's paired list, then ours/vLLM with its interval and each run's tokens/s and τ."""
    env = dict(os.environ)
    plans = [plan(c, env) for c in configs(method, a)]
    record_plans(plans, model, a.repeat, console)
    ours, theirs = (read_table(p.out, "prompts") for p in plans)
    ratio = intervals.speedup_interval(ours, theirs, paired=True)
    row = {"method": method, "ours_over_vllm": ratio.value, "interval95": [ratio.low, ratio.high],
           "prompts": ratio.prompts, "units": ratio.units}
    for engine, prompts, planned in zip(ENGINES, (ours, theirs), plans):
        rate = intervals.mean_interval(prompts)
        row[engine] = {"tokens_per_s": rate.value, "interval95": [rate.low, rate.high],
                       "tau": tau(prompts), "options": options_record(planned.options)}
    row["vllm"]["speculative_config"] = plans[1].engine.speculative_config
    row["specbench"]["phases_ms"] = phases_ms(plans[0].out, PHASES)  # vLLM exposes none
    console.print(f"{method}: ours/vLLM {ratio.text(3)} (paired, {ratio.prompts} prompts); ours "
                  f"{row['specbench']['tokens_per_s']:.1f} tok/s τ {row['specbench']['tau']:.2f}, vLLM "
                  f"{row['vllm']['tokens_per_s']:.1f} tok/s τ {row['vllm']['tau']:.2f}", highlight=False)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="baseline,suffix,pld,eagle3,dflash,sps")
    ap.add_argument("--target", default=None, help="as `run --target` (random:NAME: vLLM loads the same weights "
                    "written as a folder, loading.random_folder)")
    ap.add_argument("--dataset", default="spec-bench")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--batch-invariant", default="auto", choices=("auto", "on", "off"),
                    help="our target's setting (vLLM's CPU engine is not batch-invariant)")
    ap.add_argument("--tuned", action="store_true", help="each engine at tune's budget for the method")
    ap.add_argument("--opt", action="append", default=[], help="METHOD.KEY=VALUE for both engines (repeatable)")
    ap.add_argument("--ours-opt", action="append", default=[], help="METHOD.KEY=VALUE for our engine only (repeatable)")
    ap.add_argument("--paper-budget", action="store_true", help="our engine drafts the paper's budget where `run` "
                    "drafts a CPU budget (budgets.CPU_BUDGETS)")
    ap.add_argument("--engine-arg", action="append", default=[], help="KEY=VALUE for vLLM's engine (repeatable), "
                    "e.g. max_model_len=8192 where the model's whole context does not fit vLLM's CPU KV cache")
    ap.add_argument("--out", type=Path, default=Path("results/vllm-parity"))
    ap.add_argument("--resume", action="store_true", help="continue the runs already under --out")
    ap.add_argument("--record", type=Path, default=None, help="write the record here (JSON)")
    a = ap.parse_args()
    console = Console()
    methods = a.methods.split(",")
    a.opt_for, a.ours_opt_for = member_opts(a.opt, methods), member_opts(a.ours_opt, methods)  # METHOD.KEY=VALUE
    use_threads(a.threads)
    first, engine = (plan(c, dict(os.environ)) for c in configs(methods[0], a))
    target_folder(engine)  # a random target's folder for vLLM, drawn (once) before ours loads: never two copies
    model = loaded_target(first, None, False)  # our target, shared by every method's run
    rows = [measure(m, model, a, console) for m in methods]
    if a.record:
        write_record(a.record, "ours/vLLM tokens/s per method, interleaved prompt by prompt (benchmarks/vllm_parity.py)",
                     "perf_counter (the runs' own decode_ms)", first.device,
                     settings={k: getattr(a, k) for k in ("target", "engine_arg", "dataset", "limit", "max_new_tokens",
                                                          "dtype", "threads", "warmup", "repeat", "tuned",
                                                          "batch_invariant", "paper_budget", "opt", "ours_opt")},
                     methods=rows)
        console.print(f"record: {a.record}")


if __name__ == "__main__":
    main()
