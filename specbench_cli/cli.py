"""The `specbench` command line: run, profile, oracle, calibrate, report."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import click
import typer
from rich.console import Console
from typer.core import TyperGroup

from specbench_cli.core.errors import UsageError
from specbench_cli.inputs import use_threads

console = Console()
err_console = Console(stderr=True)
RESUMABLE = ("run", "profile", "oracle", "sweep", "calibrate", "train-drafter")  # commands with --resume (or resuming)


def fail(message: str) -> None:
    err_console.print(f"error: {message}", highlight=False, soft_wrap=True, markup=False)
    raise typer.Exit(2)


class Commands(TyperGroup):
    """Every command ends the same way on bad input (one line, exit 2) and on Ctrl-C or SIGTERM (one line, exit
    130 or 143): handled here once, for the console script and for tests that invoke `app` alike."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UsageError as err:
            fail(str(err))
        except KeyboardInterrupt as err:  # SIGTERM is `run_folder.Terminated` while a run owns its folder
            term = type(err).__name__ == "Terminated"
            kept = ": finished prompts are kept; continue with --resume" if ctx.invoked_subcommand in RESUMABLE else ""
            err_console.print(f"interrupted{' (SIGTERM)' if term else ''}{kept}", highlight=False)
            raise typer.Exit(143 if term else 130)


app = typer.Typer(cls=Commands, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Benchmark speculative decoding methods: lossless outputs, per-round timings, Parquet records.",
                  epilog="Every command's options in detail: docs/options.md")


# Options `run` and `profile` share (one declaration, one help text).
Method = Annotated[str, typer.Option(help="Decoding method (see run --list).")]
Model = Annotated[str, typer.Option(help="Registered model name (see run --list); with --target, any new name.")]
Dataset = Annotated[str, typer.Option(
    help="Registered dataset name (see run --list), a .jsonl "
         "file, or speed-bench:PATH (a prepared SPEED-Bench folder).")]
Categories = Annotated[Optional[list[str]], typer.Option(
    "--category", "--subtask", help="Keep only these categories or subtasks (repeatable).")]
Temperature = Annotated[float, typer.Option(help="0 = greedy; > 0 samples, with lossless rejection sampling.")]
Seed = Annotated[int, typer.Option(help="Base seed; each prompt and turn derives its own.")]
Dtype = Annotated[str, typer.Option(
    help="auto (bfloat16 on CUDA and on CPUs with bf16 in hardware, else float32), float32, bfloat16 or float16.")]
Device = Annotated[str, typer.Option(
    help="auto (cuda if available, else cpu), cpu, cuda, cuda:N, or "
         "split: the target over all visible GPUs (not for latency).")]
Warmup = Annotated[int, typer.Option(
    help="Prompts decoded first and not recorded, taken from the dataset outside the scored selection.")]
Opts = Annotated[Optional[list[str]], typer.Option(
    help="Method hyper-parameter key=value (repeatable); see run --list for each method's options and defaults.")]
TargetRef = Annotated[Optional[str], typer.Option(
    help="Target checkpoint (folder or Hugging Face id) replacing "
         "the registered one, or random:NAME[:SEED] (random weights).")]
Drafters = Annotated[Optional[list[str]], typer.Option(
    help="Drafter checkpoint NAME=PATH_OR_HUB_ID (repeatable) replacing the registered one; names in run --list.")]
Compile = Annotated[bool, typer.Option(
    help="Compile the target's forwards and the drafters' steps (torch.compile, static shapes). Default: off (eager).")]
CompileBuckets = Annotated[str, typer.Option(
    help="--compile: verify sizes compiled once each; a forward is padded to the smallest that fits (masked padding).")]
BatchInvariant = Annotated[str, typer.Option(
    help="auto, on or off: compute every verify row exactly as the one-token "
         "decode (bf16/fp16 outputs = baseline's). auto: on where nearly free.")]
Threads = Annotated[Optional[int], typer.Option(help="CPU threads for torch. Default: torch's choice.")]


@app.command(epilog="Every option in detail: docs/options.md#specbench-run")
def run(
    method: Annotated[str, typer.Option(
        help="Decoding method (see run --list), or a comma list "
             "(baseline,suffix,eagle3) decoded side by side on one target.")] = "baseline",
    model: Model = "smollm2-135m",
    dataset: Dataset = "spec-bench",
    category: Categories = None,
    limit: Annotated[Optional[int], typer.Option(
        help="Keep N prompts, taken round-robin across subtasks. Default: all.")] = None,
    shard: Annotated[Optional[str], typer.Option(
        help="Run shard i/n (0-based) of the selection. Default: "
             "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT if set, else 0/1.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Most tokens generated per turn (Spec-Bench uses 1024).")] = 1024,
    temperature: Temperature = 0.0,
    seed: Seed = 0,
    dtype: Dtype = "auto",
    device: Device = "auto",
    warmup: Warmup = 1,
    out: Annotated[Optional[Path], typer.Option(
        help="Results directory. Default: results/<model>_<dataset>_<method>_t<temperature>[_shardIofN].")] = None,
    resume: Annotated[bool, typer.Option(
        help="Continue an existing results directory (same settings required).")] = False,
    opt: Opts = None,
    target: TargetRef = None,
    drafter: Drafters = None,
    threads: Threads = None,
    compile: Compile = False,
    compile_buckets: CompileBuckets = "1,4,16,64",
    batch_invariant: BatchInvariant = "auto",
    tuned: Annotated[bool, typer.Option(
        help="Use the draft budget `specbench tune` chose for this "
             "model and method on this machine; an --opt overrides it.")] = False,
    cpu_budget: Annotated[bool, typer.Option(
        "--cpu-budget/--paper-budget",
        help="On a CPU, our engine drafts eagle3's CPU budget (a one-token chain) where no --opt sets its options; "
             "--paper-budget keeps the paper's tree.")] = True,
    engine: Annotated[str, typer.Option(
        help="Who decodes: specbench (our engine) or vllm (vLLM in its own Python; which methods it runs: "
             "docs/engines.md#method-mapping).")] = "specbench",
    engine_arg: Annotated[Optional[list[str]], typer.Option(
        help="--engine vllm: KEY=VALUE passed to vllm.EngineArgs "
             "(repeatable; JSON values parsed), e.g. max_model_len=4096.")] = None,
    engine_python: Annotated[Optional[str], typer.Option(
        help="--engine vllm: the Python with vLLM. Default: $SPECBENCH_VLLM_PYTHON, "
             "this Python if it imports vllm, else .venv-vllm/bin/python.")] = None,
    concurrency: Annotated[str, typer.Option(
        help="--engine vllm: requests kept in flight (closed loop); "
             "a comma list (1,2,4,8) runs one level after another.")] = "1",
    batch_size: Annotated[str, typer.Option(
        help="Our engine: sequences decoded together (continuous "
             "batching); a comma list (1,2,4,8) runs one size after another.")] = "1",
    engine_url: Annotated[Optional[str], typer.Option(
        help="--engine vllm: measure a vLLM server already running at "
             "http://HOST:PORT. Default: specbench starts the engine.")] = None,
    engine_serve: Annotated[bool, typer.Option(
        help="--engine vllm: start `vllm serve` on 127.0.0.1 "
             "and measure it over HTTP. Default: off (no HTTP).")] = False,
    replay: Annotated[bool, typer.Option(
        help="At temperature 0, after each prompt (untimed), check "
             "every emitted token against the target's greedy choice.")] = True,
    acceptance: Annotated[Optional[list[str]], typer.Option(
        help="Price a method at an acceptance you set: synthetic:RATE or "
             "profile:FILE (repeatable; not lossless). Default: the target decides.", show_default=False)] = None,
    repeat: Annotated[int, typer.Option(
        help="Passes over the selection, interleaved with a --method "
             "list's other methods; more passes narrow report's intervals.")] = 1,
    list_: Annotated[bool, typer.Option("--list", help="List methods, models and datasets, then exit.")] = False,
) -> None:
    """Decode a dataset with one method and write rounds.parquet, prompts.parquet and run.json."""
    if list_:
        from specbench_cli.commands.listing import show_lists

        show_lists(console)
        return
    from specbench_cli.inputs import RunConfig
    from specbench_cli.commands.run import run_levels

    config = RunConfig(method=method, model=model, dataset=dataset, categories=category or [], limit=limit,
                       shard=shard, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, dtype=dtype,
                       device=device, warmup=warmup, out=out, resume=resume, opts=opt or [], target=target,
                       drafters=drafter or [], compile=compile, compile_buckets=compile_buckets,
                       batch_invariant=batch_invariant, tuned=tuned, cpu_budget=cpu_budget, engine=engine,
                       engine_args=engine_arg or [], engine_python=engine_python, engine_url=engine_url,
                       engine_serve=engine_serve, threads=threads, repeat=repeat, replay=replay,
                       acceptance=acceptance or [])
    run_levels(config, concurrency, batch_size, threads, console)


@app.command(epilog="Every option in detail: docs/options.md#specbench-profile")
def profile(
    phases: Annotated[bool, typer.Option(
        help="Run the method on a few prompts and break each round into its phases.")] = False,
    component: Annotated[Optional[str], typer.Option(
        help="Microbenchmark one component: 'head' = dense head vs "
             "FlashHead, head alone and whole draft step (method flashhead).")] = None,
    switching: Annotated[bool, typer.Option(
        help="Routed methods' switching-cost sweep (WhiFlash Table 4/12).")] = False,
    method: Method = "baseline",
    model: Model = "smollm2-135m",
    dataset: Dataset = "spec-bench",
    category: Categories = None,
    limit: Annotated[int, typer.Option(help="Prompts profiled (round-robin across subtasks).")] = 4,
    max_new_tokens: Annotated[int, typer.Option(help="Most tokens generated per turn.")] = 128,
    temperature: Temperature = 0.0,
    seed: Seed = 0,
    dtype: Dtype = "auto",
    device: Device = "auto",
    warmup: Warmup = 1,
    reps: Annotated[int, typer.Option(
        help="--component/--switching: timed repetitions per measurement (after --warmup-reps).")] = 200,
    warmup_reps: Annotated[int, typer.Option(help="--component/--switching: untimed repetitions first.")] = 20,
    kv_lens: Annotated[Optional[list[int]], typer.Option(
        "--kv-len", help="--switching: base KV lengths (repeatable; those past "
                         "the target's context are skipped). Default: 512 ... 16384.")] = None,
    backlogs: Annotated[Optional[list[int]], typer.Option(
        "--backlog", help="--switching: backlog sizes (repeatable). Default: 1 64 128 512 1024.")] = None,
    out: Annotated[Optional[Path], typer.Option(
        help="Results directory. Default: results/profile/<model>_<dataset>_<method>[_head].")] = None,
    resume: Annotated[bool, typer.Option(
        help="--phases: continue an existing results directory (same settings required).")] = False,
    opt: Opts = None,
    target: TargetRef = None,
    drafter: Drafters = None,
    threads: Threads = None,
    compile: Compile = False,
    compile_buckets: CompileBuckets = "1,4,16,64",
    batch_invariant: BatchInvariant = "auto",
    batch_size: Annotated[int, typer.Option(
        help="--phases: sequences decoded together (run --batch-size); "
             "each batch round counts once in the phase table.")] = 1,
) -> None:
    """Where the time goes: a per-phase round breakdown (--phases) or a microbenchmark (--component head or
    --switching); writes Parquet, a table and a plot."""
    from specbench_cli.datasets import dataset_slug
    from specbench_cli.inputs import RunConfig, at_least

    chosen = [name for name, on in (("--phases", phases), ("--component", component), ("--switching", switching)) if on]
    if len(chosen) != 1:
        fail("choose one of --phases, --component head or --switching")
    from specbench_cli.registry import supports

    if component not in (None, "head"):
        fail(f"unknown --component '{component}' (choose: head)")
    measured = "switching" if switching else component
    about = {"switching": "--switching profiles a routed method's catch-up",
             "head": "--component head compares the dense head with FlashHead"}
    others = supports(method, measured) if measured else []
    if others:
        fail(f"{about[measured]}: use --method {' or '.join(others)}")
    at_least("--threads", threads, 1)
    at_least("--reps", reps, 1)
    at_least("--warmup-reps", warmup_reps, 0)
    at_least("--batch-size", batch_size, 1)
    if batch_size > 1 and not phases:
        fail("--batch-size is for --phases (a batched run); the microbenchmarks time one sequence")
    if resume and not phases:
        fail("--resume continues a --phases run; a --component or --switching measurement runs whole")
    for length in (*(kv_lens or ()), *(backlogs or ())):
        at_least("--kv-len and --backlog", length, 1)
    suffix = "_head" if component else "_switching" if switching else ""
    config = RunConfig(method=method, model=model, dataset=dataset, categories=category or [], limit=limit,
                       max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, dtype=dtype, device=device,
                       warmup=warmup, opts=opt or [], target=target, drafters=drafter or [], compile=compile,
                       compile_buckets=compile_buckets, batch_invariant=batch_invariant, batch_size=batch_size,
                       resume=resume,
                       out=out or Path("results") / "profile" / f"{model}_{dataset_slug(dataset)}_{method}{suffix}"
                       f"{f'_b{batch_size}' if batch_size > 1 else ''}")
    if not phases and config.out.exists():
        fail(f"results directory {config.out} exists; a --component or --switching measurement runs whole: pass "
             f"--out for a new one, or move it aside")
    if phases:
        from specbench_cli.commands.run import run_one

        run_dir = run_one(config, threads, console)  # checks the run's input before torch (which profile imports) loads
        from specbench_cli.commands import profile as prof

        written = prof.phases(run_dir, console)
    else:
        from specbench_cli.commands import profile as prof

        use_threads(threads)
        written = prof.component(config, reps, warmup_reps, "switching" if switching else "head",
                                 kv_lens or list(prof.SWITCH_KV), backlogs or list(prof.SWITCH_BACKLOG), console)
    console.print(f"wrote {', '.join(str(p) for p in written)}")


@app.command("train-drafter", epilog="Every option in detail: docs/options.md#specbench-train-drafter")
def train_drafter(
    method: Annotated[str, typer.Option(
        help="Drafter to train: eagle3, dflash, dart, confu or sps (sps also serves flashhead).")] = "eagle3",
    model: Annotated[str, typer.Option(help="Registered target model (see run --list).")] = "smollm2-135m",
    out: Annotated[Optional[Path], typer.Option(
        help="Checkpoint folder to write. Default: the project's "
             "drafters/<model>/<method> (the user cache if not writable).")] = None,
    corpus: Annotated[Optional[Path], typer.Option(
        help="Self-distillation corpus folder, built there if missing (a killed "
             "build resumes). Default: ~/.cache/specbench/distill/<model>.")] = None,
    prompts: Annotated[Optional[int], typer.Option(
        help="Training prompts: build the corpus with N, grow it to N, or train "
             "on its first N. Default: the corpus as it is (a new one: all 14,561).")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Longest answer generated per training prompt.")] = 160,
    batch_size: Annotated[int, typer.Option(help="Prompts generated together.")] = 16,
    steps: Annotated[int, typer.Option(help="Optimiser steps (one sequence each).")] = 2000,
    eval_every: Annotated[int, typer.Option(
        help="Steps between held-out evaluations (and saved training states).")] = 200,
    minutes: Annotated[float, typer.Option(
        help="Stop at the first held-out evaluation after this many "
             "minutes of training in this session (0: no limit).")] = 0.0,
    lr: Annotated[float, typer.Option(help="AdamW peak learning rate (linear warm-up).")] = 1e-3,
    anneal: Annotated[int, typer.Option(
        help="Over the last N steps the learning rate falls to 0 "
             "along a half cosine (0: constant after the warm-up).")] = 0,
    opt: Annotated[Optional[list[str]], typer.Option(
        help="A recipe setting METHOD.KEY=VALUE for the method trained (repeatable), e.g. --opt eagle3.ttt=5.")] = None,
    ttt: Annotated[Optional[int], typer.Option(help="Deprecated: --opt eagle3.ttt=N.", hidden=True)] = None,
    draft_vocab: Annotated[Optional[int], typer.Option(
        help="Deprecated: --opt METHOD.draft_vocab=N.", hidden=True)] = None,
    intermediate: Annotated[Optional[int], typer.Option(
        help="Deprecated: --opt METHOD.intermediate=N.", hidden=True)] = None,
    draft_layers: Annotated[Optional[int], typer.Option(
        help="Deprecated: --opt METHOD.draft_layers=N.", hidden=True)] = None,
    block_size: Annotated[Optional[int], typer.Option(
        help="Deprecated: --opt dflash.block_size=N.", hidden=True)] = None,
    anchors: Annotated[Optional[int], typer.Option(help="Deprecated: --opt METHOD.anchors=N.", hidden=True)] = None,
    slots: Annotated[Optional[int], typer.Option(help="Deprecated: --opt dart.slots=N.", hidden=True)] = None,
    gamma: Annotated[Optional[float], typer.Option(help="Deprecated: --opt dart.gamma=X.", hidden=True)] = None,
    init: Annotated[Optional[str], typer.Option(
        help="Checkpoint (folder or hub id) to fine-tune from. "
             "Default: from scratch; confu: the model's eagle3 drafter.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for the split, the order and the initialisation.")] = 0,
    resume: Annotated[bool, typer.Option(help="Continue a training run in --out from its saved state.")] = False,
    threads: Annotated[Optional[int], typer.Option(help="CPU threads for torch. Default: torch's choice.")] = None,
    device: Annotated[str, typer.Option(
        help="auto (cuda if available, else cpu), cpu, cuda or cuda:N: where "
             "the target answers, and the drafter trains (float32 either way).")] = "auto",
) -> None:
    """Train a drafter for a target on its own answers to datasets/train prompts (self-distillation)."""
    from specbench_cli.commands.train import command

    flags = {"ttt": ttt, "draft_vocab": draft_vocab, "intermediate": intermediate, "draft_layers": draft_layers,
             "block_size": block_size, "anchors": anchors, "slots": slots, "gamma": gamma}
    command.train(console, err_console, method=method, model=model, out=out, corpus=corpus, prompts=prompts,
                  max_new_tokens=max_new_tokens, batch_size=batch_size, steps=steps, eval_every=eval_every,
                  minutes=minutes, lr=lr, anneal=anneal, opt=opt, flags=flags, init=init, seed=seed, resume=resume,
                  threads=threads, device=device)


@app.command(epilog="Every option in detail: docs/options.md#specbench-oracle")
def oracle(
    drafters: Annotated[str, typer.Option(
        help="Comma-separated drafting methods to replay, e.g. eagle3,dflash,suffix.")] = "eagle3,dflash",
    model: Model = "smollm2-135m",
    dataset: Dataset = "spec-bench",
    category: Categories = None,
    limit: Annotated[Optional[int], typer.Option(
        help="Keep N prompts, taken round-robin across subtasks. Default: all.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Most tokens of each greedy trace per turn.")] = 1024,
    dtype: Annotated[str, typer.Option(
        help="auto: float32 on the CPU (exact replay; not run's bf16 "
             "choice), bfloat16 on CUDA; or float32, bfloat16, float16.")] = "auto",
    device: Device = "auto",
    warmup: Warmup = 1,
    out: Annotated[Optional[Path], typer.Option(
        help="Oracle directory. Default: results/oracle_<model>_<dataset>.")] = None,
    resume: Annotated[bool, typer.Option(
        help="Continue an existing oracle directory (same settings required).")] = False,
    opt: Annotated[Optional[list[str]], typer.Option(
        help="A drafter's hyper-parameter DRAFTER.key=value (repeatable), e.g. eagle3.depth=4.")] = None,
    target: TargetRef = None,
    drafter: Drafters = None,
    threads: Threads = None,
    compile: Compile = False,
    compile_buckets: CompileBuckets = "1,4,16,64",
) -> None:
    """Trace replay: for every position of one greedy trace per prompt, the tokens each drafter would have accepted
    there, and the static and oracle τ (WhiFlash §4)."""
    from specbench_cli.inputs import RunConfig, at_least

    run_config = RunConfig(model=model, dataset=dataset, categories=category or [], limit=limit,
                           max_new_tokens=max_new_tokens, dtype=dtype, device=device, warmup=warmup, out=out,
                           resume=resume, target=target, drafters=drafter or [], compile=compile,
                           compile_buckets=compile_buckets)
    at_least("--threads", threads, 1)
    from specbench_cli.commands.oracle import command as oracle_run

    config = oracle_run.OracleConfig([d.strip() for d in drafters.split(",") if d.strip()], run_config, opt or [])
    use_threads(threads)
    folder = oracle_run.run_oracle(config, console)
    from specbench_cli.analysis import report as rep
    from specbench_cli.analysis.results import load

    for table in rep.oracle_tables(load([folder])):
        console.print(table.rich())
        table.write(folder)
    console.print(f"wrote {folder}")


@app.command(epilog="Every option in detail: docs/options.md#specbench-calibrate")
def calibrate(
    method: Annotated[str, typer.Option(
        help="whiflash-entropy (threshold per category), whiflash-neural "
             "(router MLP + ΔAL threshold) or hvd (payoff predictor).")] = "whiflash-entropy",
    model: Model = "smollm2-135m",
    dataset: Annotated[str, typer.Option(
        help="whiflash-entropy: dataset whose categories get "
             "thresholds (its last --prompts per category are used).")] = "spec-bench",
    prompts: Annotated[Optional[int], typer.Option(
        help="whiflash-entropy: prompts per category (default 4); "
             "whiflash-neural and hvd: training prompts (default 96).")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Longest greedy trace per turn.")] = 128,
    steps: Annotated[int, typer.Option(
        help="whiflash-neural and hvd: optimiser steps (hvd: per rollout, two rollouts).")] = 1500,
    confirm: Annotated[int, typer.Option(
        help="whiflash-entropy: best simulated thresholds decoded "
             "for real per category (0 = trust the simulation).")] = 2,
    out: Annotated[Optional[Path], typer.Option(
        help="Artifact folder. Default: the project's drafters/<model>/<method>, "
             "where run finds it (user cache if not writable).")] = None,
    work: Annotated[Optional[Path], typer.Option(
        help="Replay and timing runs, resumable. Default: results/calibrate_<model>_<method>.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing artifact folder.")] = False,
    dtype: Annotated[str, typer.Option(
        help="Dtype the latencies are timed in: that of the runs the "
             "calibration is for (auto as in run). Replay stays float32.")] = "auto",
    threads: Threads = None,
) -> None:
    """Calibrate a router from trace replay and latencies measured on this machine, into an artifact that `run`
    loads automatically."""
    from specbench_cli.commands.calibrate import command as cal
    from specbench_cli.core.errors import unknown
    from specbench_cli.inputs import DTYPE_NAMES, at_least
    from specbench_cli.registry import calibrator

    calibrate_with = calibrator(method)  # a method without a calibrator fails here, in one line
    from specbench_cli.models import drafter_folder, get_model_spec

    get_model_spec(model)
    if dtype not in DTYPE_NAMES:
        raise unknown("dtype", dtype, DTYPE_NAMES)
    for option, value, low in (("--prompts", prompts, cal.least_prompts(method)), ("--max-new-tokens", max_new_tokens, 1),
                               ("--steps", steps, 1), ("--confirm", confirm, 0), ("--threads", threads, 1)):
        at_least(option, value, low)
    folder = out or drafter_folder(model, method)
    if folder.exists() and not overwrite:
        raise UsageError(f"{folder} exists; pass --overwrite to replace the calibration or --out for another folder")
    config = cal.CalibrateConfig(method, model, dataset, prompts or (4 if method == "whiflash-entropy" else 96),
                                 max_new_tokens, steps, confirm,
                                 work or Path("results") / f"calibrate_{model}_{method}", folder, dtype)
    use_threads(threads)
    calibrate_with(config, console)  # prints its own result line
    console.print(f"wrote {folder}")


@app.command(epilog="Every option in detail: docs/options.md#specbench-tune")
def tune(
    method: Annotated[str, typer.Option(
        help="Method whose draft budget is tuned: eagle3, dart, dflash, sps, "
             "suffix or pld (--engine vllm: suffix, pld, sps, eagle3, dflash).")],
    model: Model = "smollm2-135m",
    dataset: Dataset = "spec-bench",
    category: Categories = None,
    limit: Annotated[int, typer.Option(help="Tuning prompts, taken round-robin across subtasks.")] = 6,
    max_new_tokens: Annotated[int, typer.Option(
        help="Most tokens per turn in the baseline, the replays and the check runs.")] = 128,
    dtype: Dtype = "auto",
    device: Device = "auto",
    warmup: Warmup = 1,
    threads: Threads = None,
    check: Annotated[bool, typer.Option(
        help="Run the chosen and the paper's budget live beside the "
             "baseline; print the speedups (always with --batch-size).")] = True,
    batch_invariant: BatchInvariant = "auto",
    batch_size: Annotated[str, typer.Option(
        help="Our engine: a comma list of batch sizes (1,2,4,8), a budget "
             "chosen for each from its verify cost. At most --limit.")] = "1",
    engine: Annotated[str, typer.Option(
        help="specbench (a cost model over trace replays) or "
             "vllm (every candidate K measured in a vLLM engine).")] = "specbench",
    concurrency: Annotated[str, typer.Option(
        help="--engine vllm: a comma list of requests kept in flight (1,2,4,8), one choice of K each.")] = "1",
    engine_python: Annotated[Optional[str], typer.Option(
        help="--engine vllm: the Python that has vLLM (as run --engine-python).")] = None,
    engine_arg: Annotated[Optional[list[str]], typer.Option(
        help="--engine vllm: KEY=VALUE for vllm.EngineArgs, as "
             "run --engine-arg; `run --tuned` must pass the same.")] = None,
    out: Annotated[Optional[Path], typer.Option(
        help="Tune folder; an existing one is resumed. Default: results/tune_<model>_<method>[_vllm].")] = None,
    target: TargetRef = None,
    drafter: Drafters = None,
) -> None:
    """Choose the draft budget that maximises tokens/s on this machine, per batch size or vLLM concurrency;
    `run --tuned` uses it."""
    from specbench_cli.inputs import RunConfig
    from specbench_cli.commands.tune import command as tune_command

    config = RunConfig(method=method, model=model, dataset=dataset, categories=category or [], limit=limit,
                       max_new_tokens=max_new_tokens, dtype=dtype, device=device, warmup=warmup, target=target,
                       drafters=drafter or [], batch_invariant=batch_invariant, engine=engine,
                       engine_python=engine_python, engine_args=engine_arg or [], threads=threads,
                       out=out)
    tune_command.tune(config, batch_size, concurrency, check, console)


@app.command(epilog="Every option in detail: docs/options.md#specbench-report")
def report(
    results_dirs: Annotated[list[Path], typer.Argument(
        help="Run directories, or folders searched for them "
             "(shards and repeats of one experiment are merged).", show_default=False)],
    out: Annotated[Optional[Path], typer.Option(
        help="Where tables (.md/.csv/.tex) and plots (.png/.pdf) go. Default: <first RESULTS_DIR>/report.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace the files of an existing report folder.")] = False,
    compare: Annotated[Optional[Path], typer.Option(
        help="Reference results (a nightly gate): a changed output, fallen "
             "τ or speed below --max-regression fails (exit 1; undecided: 3).")] = None,
    max_regression: Annotated[float, typer.Option(help="Tolerated speedup drop, in percent, for --compare.")] = 5.0,
    along: Annotated[Optional[list[str]], typer.Option(
        help="Methods (labels as in the tables) for the τ-along-the-response "
             "plot (repeatable). Default: the first two drafting methods.")] = None,
    plots: Annotated[bool, typer.Option(help="Draw the figures.")] = True,
    classify: Annotated[bool, typer.Option(
        help="Classify each temperature-0 divergence from the baseline "
             "as a numeric tie or a mismatch (by the replays, else recomputed in the run's dtype).")] = True,
    expect: Annotated[Optional[Path], typer.Option(
        help="Published values to reproduce (TOML [[expect]] entries): exit "
             "1 on a τ or rate outside its tolerance, or with no matching run.")] = None,
    export: Annotated[Optional[tuple[str, Path]], typer.Option(
        help="FORMAT DIR: the runs' records also in another tool's "
             "layout: spec-bench or specdec-bench. Default: none.", show_default=False)] = None,
) -> None:
    """Tables and plots from results directories (acceptance, speed, losslessness, phases, oracle, engine sweeps),
    with optional regression and parity gates."""
    from specbench_cli.commands import report as reporting

    problems, undecided = reporting.report(console, results_dirs, out, overwrite, compare, max_regression, along,
                                           plots, classify, expect, export)
    for line in (*problems, *undecided):
        err_console.print(line, highlight=False, soft_wrap=True, markup=False)
    if problems or undecided:
        from specbench_cli.analysis.gate import INCONCLUSIVE_EXIT

        raise typer.Exit(1 if problems else INCONCLUSIVE_EXIT)


@app.command(epilog="Every option in detail: docs/options.md#specbench-sweep")
def sweep(
    config: Annotated[Path, typer.Argument(
        help="Sweep TOML: models, datasets, methods, [run] settings, [options.<method>] grids.", show_default=False)],
    shard: Annotated[Optional[str], typer.Option(
        help="Run jobs i, i+n, ... of shard i/n. Default: "
             "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT if set, else all jobs.")] = None,
    list_: Annotated[bool, typer.Option(
        "--list", help="Show the jobs (hash, directory, status, shard) and exit.")] = False,
    slurm: Annotated[bool, typer.Option(
        help="Write a Slurm job-array script (<out>/sweep.sbatch) instead of running.")] = False,
    shards: Annotated[Optional[int], typer.Option(help="--slurm: array tasks. Default: one per job.")] = None,
    concurrency: Annotated[int, typer.Option(help="--slurm: array tasks running at once (the % cap).")] = 4,
    hours: Annotated[float, typer.Option(help="--slurm: time limit per array task, in hours.")] = 4.0,
    cpus: Annotated[int, typer.Option(help="--slurm: CPUs per array task.")] = 8,
    submit: Annotated[bool, typer.Option(
        help="--slurm: submit the array through submitit (pip install submitit) instead of writing a script.")] = False,
    threads: Threads = None,
) -> None:
    """Expand a (model x dataset x method x option) grid into jobs and run them here, one shard of them, or as a
    Slurm array; finished jobs are skipped."""
    from specbench_cli.commands import sweep as sw
    from specbench_cli.inputs import at_least

    at_least("--threads", threads, 1)
    at_least("--shards", shards, 1)
    grid = sw.load(config)
    if list_:
        from specbench_cli.commands.listing import show_jobs

        show_jobs(console, grid, shards)
        return
    if slurm:
        n = shards or len(grid.jobs)
        if submit:
            console.print(f"submitted array job {sw.submit(config, grid, n, concurrency, hours, cpus)} ({n} tasks)")
            return
        script = grid.out / "sweep.sbatch"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(sw.slurm_script(config, grid, n, concurrency, hours, cpus))
        console.print(f"wrote {script} ({len(grid.jobs)} jobs in {n} array tasks); submit with: sbatch {script}")
        return
    use_threads(threads)
    ran, skipped = sw.run_shard(str(config), shard, console, dict(os.environ))
    console.print(f"sweep {config}: ran {ran} jobs, skipped {skipped} finished ones; results in {grid.out}")


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
