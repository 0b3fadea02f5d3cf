#!/usr/bin/env bash
# Retrain the embedded model's drafters on the first PROMPTS training prompts, then recalibrate every router
# against them, unattended: the routers fingerprint the drafters they were calibrated with, so drafters and
# routers change together or not at all. Each drafter is fine-tuned from the committed one (`--init`, which
# keeps its held-out split) and replaces it only if it scores better on the run's held-out set than the
# committed one did (the card's history starts with that score, at step 0).
#
#   scripts/retrain_embedded.sh PROMPTS WORK      e.g. scripts/retrain_embedded.sh 1600 /tmp/retrain
#
# Steps already done are skipped (WORK/.done-*), so a killed run goes on where it stopped when started again.
# Cost on 2 CPU threads (2,000 prompts, 2026-11-23): teacher passes 19 min (shipped answers are not generated again),
# 11-25 min per drafter (and 20 for the top-k pass DART and SpS need), 31 min for HVD, about 35 min for
# whiflash-neural (its replay of 96 prompts through EAGLE-3 and DFlash), 24 min for whiflash-entropy; minutes on
# a GPU. Then review `git diff --stat drafters/` and
# the cards, and commit, or `git checkout drafters/` to keep the committed ones.
set -euo pipefail
cd "$(dirname "$0")/.."
prompts=${1:?usage: scripts/retrain_embedded.sh PROMPTS WORK}
work=${2:?usage: scripts/retrain_embedded.sh PROMPTS WORK}
drafters=drafters/smollm2-135m
mkdir -p "$work"
export HF_HUB_OFFLINE=1

specbench() { .venv/bin/specbench "$@" --threads "${THREADS:-2}"; }

step() {  # step NAME COMMAND...: run once; a finished step leaves WORK/.done-NAME
    local name=$1
    shift
    if [[ -e "$work/.done-$name" ]]; then
        echo "== $name: done before"
        return
    fi
    echo "== $name: $*"
    "$@"
    touch "$work/.done-$name"
}

train() {  # train METHOD TRAIN-DRAFTER-OPTIONS...: fine-tune into WORK/METHOD (resuming a killed run there)
    local method=$1
    shift
    local resume=()
    [[ -e "$work/$method/train_state.pt" ]] && resume=(--resume)
    specbench train-drafter --method "$method" --prompts "$prompts" --out "$work/$method" "${resume[@]}" "$@"
}

adopt() {  # adopt METHOD: replace the committed drafter if the new one beats it at the first draft position
    local method=$1
    if .venv/bin/python - "$work/$method/card.json" "$drafters/$method/card.json" <<'EOF'
import json, sys
new, committed = (json.load(open(path)) for path in sys.argv[1:])
# The mark: the committed drafter scored on this run's held-out set (step 0), when the run started from it;
# ConFu starts from an EAGLE-3, so its mark is the committed ConFu's own score (on the split it trained with).
first = new["history"][0]
before = (first["heldout_top1"] if first["step"] == 0 and new["method"] != "confu"
          else committed["heldout_top1_per_position"])[0]
after = new["heldout_top1_per_position"][0]
print(f"{new['method']}: held-out top-1 at the first position {before} -> {after}")
sys.exit(0 if after > before else 1)
EOF
    then
        rm -rf "${drafters:?}/$method" && mkdir "$drafters/$method"
        # everything the trainer published (DART's trie, FlashHead's clusters beside SpS), not its resume state
        cp -r "$work/$method"/. "$drafters/$method/" && rm -f "$drafters/$method/train_state.pt"
    else
        echo "$method: kept the committed drafter"
    fi
}

# Drafters. ConFu starts from the registered EAGLE-3, so it follows the adopted one.
step eagle3 train eagle3 --init "$drafters/eagle3" --steps 3000 --anneal 2900 --eval-every 500
step adopt-eagle3 adopt eagle3
step dflash train dflash --init "$drafters/dflash" --opt dflash.anchors=32 --lr 5e-4 --steps 1000 --anneal 900 --eval-every 250
step adopt-dflash adopt dflash
step confu train confu --opt confu.anchors=32 --lr 5e-4 --steps 600 --eval-every 200
step adopt-confu adopt confu
step dart train dart --init "$drafters/dart" --steps 4000 --anneal 3900 --eval-every 500
step adopt-dart adopt dart
step sps train sps --init "$drafters/sps" --lr 5e-4 --steps 2400 --anneal 2300 --eval-every 400
step adopt-sps adopt sps

# Routers, against the drafters now registered (calibration prompts are never training prompts).
step hvd specbench calibrate --method hvd --prompts 96 --max-new-tokens 128 --steps 1500 --overwrite \
    --work "$work/calibrate-hvd"
step whiflash-neural specbench calibrate --method whiflash-neural --prompts 96 --max-new-tokens 128 --steps 1500 \
    --overwrite --work "$work/calibrate-neural"
step whiflash-entropy specbench calibrate --method whiflash-entropy --dataset spec-bench --prompts 2 \
    --max-new-tokens 96 --confirm 2 --overwrite --work "$work/calibrate-entropy"
echo "== done: review git diff --stat drafters/ and the cards in $drafters"
