"""Attention one query row at a time, a C++ kernel of ours built on first use (`row_attention.cpp`).

Why a kernel: on a CPU in half precision every attention of a decode was ~15 small PyTorch operators a layer
(float32 casts of the cached keys and values, two matmuls, mask, softmax), about a third of a decode of the
embedded model; and a batch-invariant target needed `attention.exact_attention`'s machinery (each row's keys
re-ordered as a decode reads them, a float32 copy of the cache, calls sized so that MKL rounds alike) to make a
verify row equal the decode at its position. This kernel computes every (sequence, query head, row) by one
code path over the keys its mask row shows, in slot order, in float32: a row's result depends only on those
keys' values and order, not on their slots, the rows beside it or the threads. A decode and a verify row at the
same position see the same keys in the same order (a tree node's ancestors sit at other slots than a decode
puts them, but in the same order), so they get the same bits by construction, trees included.

Built with torch's `cpp_extension` (g++ and ninja, `-O3 -march=native`) into torch's extension cache, under a
name keyed by the source, torch's version and this CPU's flags, so a cache shared by machines never hands one
CPU another's build. Where it cannot be built (no compiler, no ninja) `kernel()` is None, and there or with
SPECBENCH_ROW_ATTENTION=0 (`rows_alone`) the target keeps the PyTorch forms (`core.attention`); run.json's
`attention` says which ran.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch

from specbench_cli.core.kernels import float32_kernels

SOURCE = Path(__file__).with_name("row_attention.cpp")
# built into one library with the kernel: what they share, and the decoder layers (`core.decoder_layers`)
SOURCES = (SOURCE, SOURCE.with_name("decoder_layers.cpp"))
HEADER = SOURCE.with_name("row_kernels.h")
log = logging.getLogger(__name__)


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


@functools.cache
def kernel() -> Callable[..., torch.Tensor] | None:
    """`torch.ops.specbench.row_attention(q [B, H, R, d], k, v [B, KVH, S, d], mask bool [B, R, S], scale)` ->
    [B, R, H, d] in q's dtype, built on first use (tens of seconds once per machine); None where it cannot be."""
    code = b"".join(path.read_bytes() for path in (*SOURCES, HEADER))
    key = hashlib.sha256(code + torch.__version__.encode() + _cpu_flags().encode()).hexdigest()[:12]
    try:
        from torch.utils import cpp_extension
        cpp_extension.load(name=f"specbench_row_attention_{key}", sources=[str(path) for path in SOURCES],
                           extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                           is_python_module=False, verbose=False)
    except Exception as error:  # no compiler, no ninja, a failed build: the PyTorch forms stay
        log.warning("row attention kernel not built (%s); attention stays on PyTorch operators",
                    str(error).splitlines()[0] if str(error) else type(error).__name__)
        return None
    return torch.ops.specbench.row_attention


HEAD_DIMS = (16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256)  # what the kernel is built for (16-float vectors)


def available(device: torch.device, dtype: torch.dtype, plain: bool = False) -> bool:
    """Whether the kernel attends for targets on `device` in `dtype`: half precision on a CPU (where SDPA's
    one-query kernel is slow and a batch-invariant verify needs rows computed alone) and a `plain` float32 target
    (`kernels.float32_kernels`; a batch-invariant one keeps SDPA, the reference path), SPECBENCH_ROW_ATTENTION not 0, and a
    kernel that builds."""
    kernel_dtype = (dtype in (torch.bfloat16, torch.float16)
                    or (dtype == torch.float32 and plain and float32_kernels()))
    return (device.type == "cpu" and kernel_dtype
            and os.environ.get("SPECBENCH_ROW_ATTENTION", "1") != "0" and kernel() is not None)


def rows_alone(device: torch.device, dtype: torch.dtype, head_dim: int, plain: bool = False) -> bool:
    """Whether an eager target attends one row at a time with the kernel (`available`, and a head dim it is
    built for)."""
    return head_dim in HEAD_DIMS and available(device, dtype, plain)


def row_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of q [B, H, R, d] over k, v [B, KVH, S, d] where mask [B, R, S] (True: attend) allows, every row
    computed alone (module docstring); [B, R, H * d] in q's dtype."""
    out = kernel()(q, k, v, mask, scale)
    return out.view(q.shape[0], q.shape[2], -1)
