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
                  help="Benchmark speculative decoding methods: lossless outputs, per-round timings, Parquet records.")


# Options `run` and `profile` share (one declaration, one help text).
Method = Annotated[str, typer.Option(help="Decoding method (see run --list).")]
Model = Annotated[str, typer.Option(help="Registered model name (see run --list); with --target, any new name.")]
Dataset = Annotated[str, typer.Option(help="Registered dataset name (see run --list), a path to a .jsonl file, or speed-bench:PATH (a SPEED-Bench folder prepared by its prepare_data.py).")]
Categories = Annotated[Optional[list[str]], typer.Option("--category", "--subtask", help="Keep only these categories or subtasks (repeatable).")]
Temperature = Annotated[float, typer.Option(help="0 = greedy; > 0 samples, with lossless rejection sampling.")]
Seed = Annotated[int, typer.Option(help="Base seed; each prompt and turn derives its own.")]
Dtype = Annotated[str, typer.Option(help="auto: bfloat16 on CUDA and on a CPU with bf16 in hardware (flags amx_bf16 or avx512_bf16), float32 on other CPUs; or float32, bfloat16, float16. A bf16/fp16 run times the target as a serving engine runs it and replays every greedy turn on an exact reference (--replay, --batch-invariant).")]
Device = Annotated[str, typer.Option(help="auto (cuda if available, else cpu), cpu, cuda, cuda:N, or split: the target over all visible GPUs (device_map=auto; for acceptance studies of targets too large for one GPU, not for latency).")]
Warmup = Annotated[int, typer.Option(help="Prompts decoded first and not recorded, taken from the dataset outside the scored selection.")]
Opts = Annotated[Optional[list[str]], typer.Option(help="Method hyper-parameter key=value (repeatable); see run --list for each method's options and defaults.")]
TargetRef = Annotated[Optional[str], typer.Option(help="Target checkpoint (local folder or Hugging Face id) replacing the model's registered one, or random:NAME[:SEED]: NAME's architecture with random weights (timings only; see run --list).")]
Drafters = Annotated[Optional[list[str]], typer.Option(help="Drafter checkpoint NAME=PATH_OR_HUB_ID (repeatable), replacing the model's registered one; names per method in run --list.")]
Compile = Annotated[bool, typer.Option(help="Compile the target's decode and verify forwards with static shapes (torch.compile: CUDA graphs via mode reduce-overhead on GPU, inductor on CPU; with --batch-size, one [B, bucket] graph per bucket). Compilation happens before the first timed prompt and is reported in run.json. Default: off (eager), the engine SD papers measure; on a CPU the compiled forward runs about as fast as the eager one after a minute of compiling per bucket, on a GPU it removes the launch overhead that dominates small models.")]
CompileBuckets = Annotated[str, typer.Option(help="--compile: verify sizes compiled once each; a forward is padded to the smallest that fits (masked padding).")]
BatchInvariant = Annotated[str, typer.Option(help="auto, on or off: time the target batch-invariant, every verify row, of a chain or a tree, computed exactly as the one-token decode at its position computes it (row-wise modules in one call where a start-up probe finds every row unchanged by the row count, else in 8-row blocks; attention over each row's keys in the decode's order; where attention runs through SDPA, in float32 or on CUDA, a greedy tree round verifies its accepted path again as a chain), so that in bf16/fp16 every method's output equals the baseline's bit for bit. auto: on where it costs nothing worth measuring, an eager bf16/fp16 target on a CPU where the row attention kernel builds (its decode and verifies within a few percent of the plain target's; run.json's attention says \"row kernel\"); off elsewhere (float32, CUDA, --compile), where it costs verify time a serving engine does not pay: the timed target runs as an engine runs it and losslessness is checked apart, by the greedy replay (--replay).")]
Threads = Annotated[Optional[int], typer.Option(help="CPU threads for torch. Default: torch's choice.")]


@app.command()
def run(
    method: Annotated[str, typer.Option(help="Decoding method (see run --list), or a comma list (baseline,suffix,eagle3) decoded side by side on one loaded target: each prompt by every method in turn, the order rotated prompt by prompt, each method into <out>/<method>; `report` then pairs them (intervals in every speed figure). baseline,baseline is the A/A run that measures the machine's noise. In a list every --opt names its method: --opt eagle3.depth=4.")] = "baseline",
    model: Model = "smollm2-135m",
    dataset: Dataset = "spec-bench",
    category: Categories = None,
    limit: Annotated[Optional[int], typer.Option(help="Keep N prompts, taken round-robin across subtasks. Default: all.")] = None,
    shard: Annotated[Optional[str], typer.Option(help="Run shard i/n (0-based) of the selection. Default: SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT if set, else 0/1.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Most tokens generated per turn (Spec-Bench uses 1024).")] = 1024,
    temperature: Temperature = 0.0,
    seed: Seed = 0,
    dtype: Dtype = "auto",
    device: Device = "auto",
    warmup: Warmup = 1,
    out: Annotated[Optional[Path], typer.Option(help="Results directory. Default: results/<model>_<dataset>_<method>_t<temperature>[_shardIofN].")] = None,
    resume: Annotated[bool, typer.Option(help="Continue an existing results directory (same settings required).")] = False,
    opt: Opts = None,
    target: TargetRef = None,
    drafter: Drafters = None,
    threads: Threads = None,
    compile: Compile = False,
    compile_buckets: CompileBuckets = "1,4,16,64",
    batch_invariant: BatchInvariant = "auto",
    tuned: Annotated[bool, typer.Option(help="Use the draft budget `specbench tune` chose for this model and method on this machine (same dtype, device, threads and batch invariance); an --opt still overrides it. Recorded in run.json (tuned_from); default folder name gets -tuned.")] = False,
    engine: Annotated[str, typer.Option(help="Who decodes: 'specbench' (our engine) or 'vllm' (a vLLM engine in its own Python; methods baseline, pld, suffix, eagle3, dflash, sps; see the README's 'Production engines').")] = "specbench",
    engine_arg: Annotated[Optional[list[str]], typer.Option(help="--engine vllm: KEY=VALUE passed to vllm.EngineArgs unchanged (repeatable; the value read as JSON when it parses), e.g. tensor_parallel_size=2, max_model_len=4096, enforce_eager=true.")] = None,
    engine_python: Annotated[Optional[str], typer.Option(help="--engine vllm: the Python that has vLLM. Default: $SPECBENCH_VLLM_PYTHON, this Python if it imports vllm, else .venv-vllm/bin/python (scripts/setup-vllm.sh).")] = None,
    concurrency: Annotated[str, typer.Option(help="--engine vllm: requests kept in flight (a closed loop: a new one starts when one finishes). A comma list (1,2,4,8) runs one level after another, each its own run (folder ..._c<N>, or <out>/c<N> with --out); `report` then shows throughput and speedup against concurrency. Default: 1.")] = "1",
    batch_size: Annotated[str, typer.Option(help="Our engine: sequences decoded together, one target forward per round over all of them; a finished sequence's slot takes the next prompt at once (continuous batching; a conversation keeps its slot for all its turns). A comma list (1,2,4,8,16) runs one size after another, each its own run (folder ..._b<N>, or <out>/b<N> with --out); `report` then shows throughput and speedup against batch size (DART Tables 5-7). Methods: baseline, pld, suffix, eagle3, dflash, dart and the routed whiflash-*, hvd, hvd-freq (each sequence routed on its own). At most the number of prompts selected. Default: 1.")] = "1",
    engine_url: Annotated[Optional[str], typer.Option(help="--engine vllm: measure a vLLM server already running (http://HOST:PORT; a multi-GPU or multi-node deployment), started with the method's --speculative-config and --per-request-spec-decode-metrics detailed (specbench prints the matching `vllm serve` command if it does not match). Waited for 30 s. Default: specbench starts the engine.")] = None,
    engine_serve: Annotated[bool, typer.Option(help="--engine vllm: start `vllm serve` on 127.0.0.1 (the engine's Python, the run's engine arguments) and reach it over HTTP, as a deployment is measured; stopped at the end. Default: off (vLLM's engine loop in a process of its own, no HTTP).")] = False,
    replay: Annotated[bool, typer.Option(help="At temperature 0, after each prompt (untimed): every emitted token checked against the target's greedy choice after the turn's earlier tokens, on the batch-invariant target on a CPU (exact) or the plain one on CUDA; a token that differs is a numeric tie or a mismatch (prompts.parquet replay_*, report's replay table; a mismatch fails report --compare). A production engine's (--engine vllm) turns are replayed once it has stopped, on the same reference in this process.")] = True,
    acceptance: Annotated[Optional[list[str]], typer.Option(help="Price a method at an acceptance you set: synthetic:RATE (each draft position accepted with probability RATE given its parent was) or profile:FILE (per-position rates of a speculation_profile.json); in a method list, for every method that drafts, or METHOD.SPEC for one (repeatable). Draft and verify run at full cost; outputs are not lossless. Default: the target decides.", show_default=False)] = None,
    repeat: Annotated[int, typer.Option(help="Passes over the selection, interleaved with the other methods of a --method list; each pass's rows carry its number (column repeat) and start from fresh cross-prompt state (a suffix cache). More passes narrow the intervals `report` prints. Default: 1.")] = 1,
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
                       batch_invariant=batch_invariant, tuned=tuned, engine=engine, engine_args=engine_arg or [],
                       engine_python=engine_python, engine_url=engine_url, engine_serve=engine_serve, threads=threads, repeat=repeat,
                       replay=replay, acceptance=acceptance or [])
    run_levels(config, concurrency, batch_size, threads, console)


@app.command()
def profile(
    phases: Annotated[bool, typer.Option(help="Run the method on a few prompts and break each round into its phases.")] = False,
    component: Annotated[Optional[str], typer.Option(help="Microbenchmark one component: 'head' = dense head vs FlashHead, head alone and whole draft step (method flashhead).")] = None,
    switching: Annotated[bool, typer.Option(help="Routed methods' switching-cost sweep (WhiFlash Table 4/12).")] = False,
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
    reps: Annotated[int, typer.Option(help="--component/--switching: timed repetitions per measurement (after --warmup-reps).")] = 200,
    warmup_reps: Annotated[int, typer.Option(help="--component/--switching: untimed repetitions first.")] = 20,
    kv_lens: Annotated[Optional[list[int]], typer.Option("--kv-len", help="--switching: base KV lengths (repeatable); lengths past the target's context are skipped. Default: 512 ... 16384 (WhiFlash Table 4).")] = None,
    backlogs: Annotated[Optional[list[int]], typer.Option("--backlog", help="--switching: backlog sizes (repeatable). Default: 1 64 128 512 1024.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Results directory. Default: results/profile/<model>_<dataset>_<method>[_head].")] = None,
    opt: Opts = None,
    target: TargetRef = None,
    drafter: Drafters = None,
    threads: Threads = None,
    compile: Compile = False,
    compile_buckets: CompileBuckets = "1,4,16,64",
    batch_invariant: BatchInvariant = "auto",
    batch_size: Annotated[int, typer.Option(help="--phases: sequences decoded together (run --batch-size); each batch round counts once in the phase table.")] = 1,
) -> None:
    """Where the time goes: per-phase round breakdown (--phases) or component microbenchmarks (--component head).
    Every profile writes Parquet, a Markdown/CSV/LaTeX table and a PNG/PDF plot, and names its clock."""
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
    for length in (*(kv_lens or ()), *(backlogs or ())):
        at_least("--kv-len and --backlog", length, 1)
    suffix = "_head" if component else "_switching" if switching else ""
    config = RunConfig(method=method, model=model, dataset=dataset, categories=category or [], limit=limit,
                       max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, dtype=dtype, device=device,
                       warmup=warmup, opts=opt or [], target=target, drafters=drafter or [], compile=compile,
                       compile_buckets=compile_buckets, batch_invariant=batch_invariant, batch_size=batch_size,
                       out=out or Path("results") / "profile" / f"{model}_{dataset_slug(dataset)}_{method}{suffix}"
                       f"{f'_b{batch_size}' if batch_size > 1 else ''}")
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


@app.command("train-drafter")
def train_drafter(
    method: Annotated[str, typer.Option(help="Drafter to train: eagle3, dflash, dart, confu or sps (sps also serves flashhead).")] = "eagle3",
    model: Annotated[str, typer.Option(help="Registered target model (see run --list).")] = "smollm2-135m",
    out: Annotated[Optional[Path], typer.Option(help="Checkpoint folder to write. Default: the project's drafters/<model>/<method> (the checkout's or the installed package's; the user cache if not writable).")] = None,
    corpus: Annotated[Optional[Path], typer.Option(help="Self-distillation corpus folder; built there if missing. A killed build resumes from the answers it logged (answers.jsonl); answers shipped in datasets/train/distilled/<model>.corpus.json.xz (the committed drafters' corpus) are taken, not generated, when they were built with the same --max-new-tokens. Default: ~/.cache/specbench/distill/<model>.")] = None,
    prompts: Annotated[Optional[int], typer.Option(help="Training prompts in the corpus: it is built with N, grown to N when it holds fewer (only the new prompts are answered), or trained on its first N. Default: the corpus as it is; when it is built, all 14,561 (the training files less their calibration share; hours on a laptop CPU, minutes on a GPU).")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Longest answer generated per training prompt.")] = 160,
    batch_size: Annotated[int, typer.Option(help="Prompts generated together.")] = 16,
    steps: Annotated[int, typer.Option(help="Optimiser steps (one sequence each).")] = 2000,
    eval_every: Annotated[int, typer.Option(help="Steps between held-out evaluations (and saved training states).")] = 200,
    minutes: Annotated[float, typer.Option(help="Stop at the first held-out evaluation after this many minutes of training in this session (a resumed run's earlier sessions do not count), if --steps are not done by then (0: no limit).")] = 0.0,
    lr: Annotated[float, typer.Option(help="AdamW peak learning rate (linear warm-up).")] = 1e-3,
    anneal: Annotated[int, typer.Option(help="Over the last N steps the learning rate falls to 0 along a half cosine (N = --steps − 100 is SpecForge's warm-up + cosine schedule; with --resume and more --steps, a run continued at a constant rate ends annealed). 0: constant after the warm-up, as the committed drafters were trained.")] = 0,
    opt: Annotated[Optional[list[str]], typer.Option(help="A recipe setting METHOD.KEY=VALUE (repeatable; METHOD: the one trained): ttt (eagle3 training-time-test steps, default 3), draft_vocab (eagle3/dart draft vocabulary: most frequent corpus tokens, 4096), intermediate (eagle3/dart/dflash draft MLP width, 1024), draft_layers (dflash: draft layers, default 1; sps: target layers kept, default 2; 0 = the recipe's default), block_size (dflash block, 8), anchors (dflash/dart/confu anchor positions per sequence, 64), slots (dart mask slots, 4), gamma (dart: KL weight of level l is gamma^l, 0.6). E.g. --opt eagle3.ttt=5.")] = None,
    ttt: Annotated[Optional[int], typer.Option(help="Deprecated: --opt eagle3.ttt=N.", hidden=True)] = None,
    draft_vocab: Annotated[Optional[int], typer.Option(help="Deprecated: --opt METHOD.draft_vocab=N.", hidden=True)] = None,
    intermediate: Annotated[Optional[int], typer.Option(help="Deprecated: --opt METHOD.intermediate=N.", hidden=True)] = None,
    draft_layers: Annotated[Optional[int], typer.Option(help="Deprecated: --opt METHOD.draft_layers=N.", hidden=True)] = None,
    block_size: Annotated[Optional[int], typer.Option(help="Deprecated: --opt dflash.block_size=N.", hidden=True)] = None,
    anchors: Annotated[Optional[int], typer.Option(help="Deprecated: --opt METHOD.anchors=N.", hidden=True)] = None,
    slots: Annotated[Optional[int], typer.Option(help="Deprecated: --opt dart.slots=N.", hidden=True)] = None,
    gamma: Annotated[Optional[float], typer.Option(help="Deprecated: --opt dart.gamma=X.", hidden=True)] = None,
    init: Annotated[Optional[str], typer.Option(help="Checkpoint (folder or hub id) the draft starts from, fine-tuned with a fresh optimiser; its shape and vocabulary (mask token) replace the shape options. ConFu starts from an EAGLE-3 one. Default: from scratch; for confu, the model's registered eagle3 drafter ('none' = from scratch). A checkpoint trained on the same corpus keeps its held-out split.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for the split, the order and the initialisation.")] = 0,
    resume: Annotated[bool, typer.Option(help="Continue a training run in --out from its saved state.")] = False,
    threads: Annotated[Optional[int], typer.Option(help="CPU threads for torch. Default: torch's choice.")] = None,
    device: Annotated[str, typer.Option(help="auto (cuda if available, else cpu), cpu, cuda or cuda:N: where the target answers, and the drafter trains (float32 either way).")] = "auto",
) -> None:
    """Train a drafter for a target on its own answers to datasets/train prompts (self-distillation)."""
    from specbench_cli.commands.train import command

    flags = {"ttt": ttt, "draft_vocab": draft_vocab, "intermediate": intermediate, "draft_layers": draft_layers,
             "block_size": block_size, "anchors": anchors, "slots": slots, "gamma": gamma}
    command.train(console, err_console, method=method, model=model, out=out, corpus=corpus, prompts=prompts,
                  max_new_tokens=max_new_tokens, batch_size=batch_size, steps=steps, eval_every=eval_every,
                  minutes=minutes, lr=lr, anneal=anneal, opt=opt, flags=flags, init=init, seed=seed, resume=resume,
                  threads=threads, device=device)


@app.command()
def oracle(
    drafters: Annotated[str, typer.Option(help="Comma-separated drafting methods to replay, e.g. eagle3,dflash,suffix.")] = "eagle3,dflash",
    model: Model = "smollm2-135m",
    dataset: Dataset = "spec-bench",
    category: Categories = None,
    limit: Annotated[Optional[int], typer.Option(help="Keep N prompts, taken round-robin across subtasks. Default: all.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Most tokens of each greedy trace per turn.")] = 1024,
    dtype: Annotated[str, typer.Option(help="auto: float32 on the CPU (replay = live is exact in float32; this does not follow run's bf16 choice), bfloat16 on CUDA; or float32, bfloat16, float16.")] = "auto",
    device: Device = "auto",
    warmup: Warmup = 1,
    out: Annotated[Optional[Path], typer.Option(help="Oracle directory. Default: results/oracle_<model>_<dataset>.")] = None,
    resume: Annotated[bool, typer.Option(help="Continue an existing oracle directory (same settings required).")] = False,
    opt: Annotated[Optional[list[str]], typer.Option(help="A drafter's hyper-parameter DRAFTER.key=value (repeatable), e.g. eagle3.depth=4.")] = None,
    target: TargetRef = None,
    drafter: Drafters = None,
    threads: Threads = None,
    compile: Compile = False,
    compile_buckets: CompileBuckets = "1,4,16,64",
) -> None:
    """Trace replay: one greedy trace per prompt, and for every position and drafter the tokens that drafter
    would have accepted there; static, Oracle-Task, Oracle-Prompt and Oracle-Token τ (WhiFlash §4)."""
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


@app.command()
def calibrate(
    method: Annotated[str, typer.Option(help="whiflash-entropy (entropy threshold per category), whiflash-neural (router MLP + ΔAL threshold) or hvd (payoff predictor and threshold).")] = "whiflash-entropy",
    model: Model = "smollm2-135m",
    dataset: Annotated[str, typer.Option(help="whiflash-entropy: dataset whose categories get thresholds (its last --prompts per category are used).")] = "spec-bench",
    prompts: Annotated[Optional[int], typer.Option(help="whiflash-entropy: prompts per category (default 4; the paper uses 32-64); whiflash-neural and hvd: training prompts replayed (default 96).")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Longest greedy trace per turn.")] = 128,
    steps: Annotated[int, typer.Option(help="whiflash-neural and hvd: optimiser steps (hvd: per rollout, two rollouts).")] = 1500,
    confirm: Annotated[int, typer.Option(help="whiflash-entropy: best simulated thresholds decoded for real per category (0 = trust the simulation).")] = 2,
    out: Annotated[Optional[Path], typer.Option(help="Artifact folder. Default: the project's drafters/<model>/<method>, where run finds a registered model's calibration (the user cache if not writable).")] = None,
    work: Annotated[Optional[Path], typer.Option(help="Replay and timing runs, resumable. Default: results/calibrate_<model>_<method>.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing artifact folder.")] = False,
    dtype: Annotated[str, typer.Option(help="The target's dtype where latencies are timed: that of the runs the calibration is for (auto as in run; a run in another dtype warns). Trace replay stays in float32 on the CPU.")] = "auto",
    threads: Threads = None,
) -> None:
    """Calibrate a router from trace replay and latencies measured on this machine; writes an artifact that
    `run` loads automatically (config.json card, router.safetensors or predictor.safetensors, sweep.csv)."""
    from specbench_cli.commands.calibrate import command as cal
    from specbench_cli.core.errors import unknown
    from specbench_cli.inputs import DTYPE_NAMES, at_least
    from specbench_cli.registry import calibrator

    calibrate_with = calibrator(method)  # a method without a calibrator fails here, in one line
    from specbench_cli.models import drafter_folder, get_model_spec

    get_model_spec(model)
    if dtype not in DTYPE_NAMES:
        raise unknown("dtype", dtype, DTYPE_NAMES)
    for option, value, low in (("--prompts", prompts, 1), ("--max-new-tokens", max_new_tokens, 1),
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


@app.command()
def tune(
    method: Annotated[str, typer.Option(help="The method whose draft budget is tuned: eagle3 (depth, top_k, total_token), dart (total), dflash (block_size), sps (k), suffix (max_spec_tokens) or pld (num_pred_tokens); with --engine vllm: suffix, pld, sps, eagle3 or dflash (a draft length K, num_speculative_tokens).")],
    model: Model = "smollm2-135m",
    dataset: Dataset = "spec-bench",
    category: Categories = None,
    limit: Annotated[int, typer.Option(help="Tuning prompts, taken round-robin across subtasks.")] = 6,
    max_new_tokens: Annotated[int, typer.Option(help="Most tokens per turn in the baseline, the replays and the check runs.")] = 128,
    dtype: Dtype = "auto",
    device: Device = "auto",
    warmup: Warmup = 1,
    threads: Threads = None,
    check: Annotated[bool, typer.Option(help="Run the chosen budget and the paper's live beside the baseline and print the measured speedups (with --batch-size they always run: the draft's cost at each size is read from the paper budget's run).")] = True,
    batch_invariant: BatchInvariant = "auto",
    batch_size: Annotated[str, typer.Option(help="Our engine: a comma list of batch sizes (1,2,4,8) to choose a budget for each, from the verify cost measured at that size; `run --tuned --batch-size B` applies the choice of the largest level not above B. At most --limit. Default: 1 (one budget).")] = "1",
    engine: Annotated[str, typer.Option(help="'specbench' (our engine: a cost model over trace replays) or 'vllm' (every candidate K measured in a vLLM engine at each --concurrency level; writes vLLM's num_speculative_tokens_per_batch_size table, which `run --engine vllm --tuned` passes to the engine).")] = "specbench",
    concurrency: Annotated[str, typer.Option(help="--engine vllm: a comma list of requests kept in flight (1,2,4,8), one choice of K each. Default: 1.")] = "1",
    engine_python: Annotated[Optional[str], typer.Option(help="--engine vllm: the Python that has vLLM (as run --engine-python).")] = None,
    engine_arg: Annotated[Optional[list[str]], typer.Option(help="--engine vllm: KEY=VALUE for vllm.EngineArgs, as run --engine-arg (every engine of the tune gets them; `run --tuned` must pass the same).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Tune folder (baseline, replay_cold_<i> per candidate i, live_<i> for the checked ones, candidates.csv and .png/.pdf, tune.json; per level b<N>/ or c<N>/ with the level's runs); an existing one is resumed. Default: results/tune_<model>_<method>[_vllm].")] = None,
    target: TargetRef = None,
    drafter: Drafters = None,
) -> None:
    """Choose the draft budget that maximises tokens/s on this machine: the verify cost curve c(n) measured here,
    each candidate's τ and draft time from trace replay, then the chosen budget run live (run --tuned uses it);
    per batch size (--batch-size 1,2,4,8), or per concurrency in vLLM (--engine vllm --concurrency 1,2,4,8)."""
    from specbench_cli.inputs import RunConfig
    from specbench_cli.commands.tune import command as tune_command

    config = RunConfig(method=method, model=model, dataset=dataset, categories=category or [], limit=limit,
                       max_new_tokens=max_new_tokens, dtype=dtype, device=device, warmup=warmup, target=target,
                       drafters=drafter or [], batch_invariant=batch_invariant, engine=engine,
                       engine_python=engine_python, engine_args=engine_arg or [], threads=threads,
                       out=out)
    tune_command.tune(config, batch_size, concurrency, check, console)


@app.command()
def report(
    results_dirs: Annotated[list[Path], typer.Argument(help="Run directories, or folders searched for them (shards and repeats of one experiment are merged).", show_default=False)],
    out: Annotated[Optional[Path], typer.Option(help="Where tables (.md/.csv/.tex) and plots (.png/.pdf) go. Default: <first RESULTS_DIR>/report.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace the files of an existing report folder.")] = False,
    compare: Annotated[Optional[Path], typer.Option(help="Reference results (a nightly gate): a changed output or fallen τ fails (exit 1); speedup and tokens/s fail where their 95% interval lies below 1 - --max-regression, inconclusive (exit 3) where it straddles it. Other settings or hardware: refused.")] = None,
    max_regression: Annotated[float, typer.Option(help="Tolerated speedup drop, in percent, for --compare.")] = 5.0,
    along: Annotated[Optional[list[str]], typer.Option(help="Methods (labels as in the tables) for the τ-along-the-response plot (repeatable). Default: the first two drafting methods.")] = None,
    plots: Annotated[bool, typer.Option(help="Draw the figures.")] = True,
    classify: Annotated[bool, typer.Option(help="Classify each temperature-0 divergence from the baseline as a numeric tie of the run's dtype or a mismatch, by recomputing the target's logits there in float32 on the CPU (loads each target once; a mismatch fails --compare).")] = True,
    expect: Annotated[Optional[Path], typer.Option(help="Published values to reproduce (TOML [[expect]] entries, e.g. benchmarks/parity/*.toml): exit 1 naming every τ or per-position rate outside its stated tolerance, or with no matching run.")] = None,
    export: Annotated[Optional[tuple[str, Path]], typer.Option(help="FORMAT DIR: the runs' records also in a layout another tool reads. spec-bench: one answer jsonl per method as Spec-Bench's eval.py writes them, which its evaluation/speed.py reads (new_tokens and wall_time hold decode tokens and seconds, so its tokens/s and mean accepted tokens are ours). specdec-bench: a folder per method with NVIDIA specdec_bench's acceptance_rate.json, timing.json and speculation_profile.json. Default: none.", show_default=False)] = None,
) -> None:
    """Tables and plots from results directories: τ, per-position acceptance, tokens/s, TTFT, speedup per
    subtask and category, lossless check, oracle rows, phases, environment; throughput, speedup and latency
    against concurrency (engine sweeps); the cross-engine step check (a method run in our engine and in vLLM);
    optional regression and parity gates."""
    from specbench_cli.commands import report as reporting

    problems, undecided = reporting.report(console, results_dirs, out, overwrite, compare, max_regression, along,
                                           plots, classify, expect, export)
    for line in (*problems, *undecided):
        err_console.print(line, highlight=False, soft_wrap=True, markup=False)
    if problems or undecided:
        from specbench_cli.analysis.gate import INCONCLUSIVE_EXIT

        raise typer.Exit(1 if problems else INCONCLUSIVE_EXIT)


@app.command()
def sweep(
    config: Annotated[Path, typer.Argument(help="Sweep TOML: models, datasets, methods, [run] settings, [options.<method>] grids.", show_default=False)],
    shard: Annotated[Optional[str], typer.Option(help="Run jobs i, i+n, ... of shard i/n. Default: SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT if set, else all jobs.")] = None,
    list_: Annotated[bool, typer.Option("--list", help="Show the jobs (hash, directory, status, shard) and exit.")] = False,
    slurm: Annotated[bool, typer.Option(help="Write a Slurm job-array script (<out>/sweep.sbatch) instead of running.")] = False,
    shards: Annotated[Optional[int], typer.Option(help="--slurm: array tasks. Default: one per job.")] = None,
    concurrency: Annotated[int, typer.Option(help="--slurm: array tasks running at once (the % cap).")] = 4,
    hours: Annotated[float, typer.Option(help="--slurm: time limit per array task, in hours.")] = 4.0,
    cpus: Annotated[int, typer.Option(help="--slurm: CPUs per array task.")] = 8,
    submit: Annotated[bool, typer.Option(help="--slurm: submit the array through submitit (pip install submitit) instead of writing a script.")] = False,
    threads: Threads = None,
) -> None:
    """Expand a (model x dataset x method x option) grid into jobs with stable hashes and run them here, one
    shard of them, or as a Slurm array. Finished jobs are skipped; `specbench report <out>` merges them."""
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
