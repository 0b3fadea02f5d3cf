"""Row-wise parts of the target's forward (projections, MLPs, the output head) with CPU weights prepacked.

Why: on a CPU, a bf16 `F.linear` hands oneDNN a plain row-major weight, and oneDNN reorders it into its
blocked (VNNI) layout on every call; for a decode, which reads every weight once per token from DRAM, that
reorder costs more than the product. Reordering each weight once (`torch.ops.mkldnn._reorder_linear_weight`,
the op inductor's CPU freezing pass uses) and calling oneDNN's linear on the packed weight
(`_linear_pointwise`) does the same arithmetic: on the embedded model's shapes the outputs are bit for bit
those of `F.linear` for every row count (tests/test_kernels.py), so packing changes speed, not tokens.
Measured on a 2-core AMD EPYC with avx512_bf16 (smollm2-135m, every GEMM of one forward, weights far larger
than the L3): 24 ms plain vs 15 ms packed for one row, 28 vs 16 ms for eight.

Only bf16/fp16 are packed: a packed float32 weight goes through oneDNN instead of MKL's sgemm and rounds
differently (faster too, but fp32 is the reference dtype whose outputs other engines are compared with).
The packed copies live beside the model's own weights (drafters and `generate()` still use those), so
the target's projections take twice their memory on a CPU.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

PACKED_DTYPES = (torch.bfloat16, torch.float16)
PACK_ROWS = 8  # the row count oneDNN is told to expect (a decode has 1, a verify a few to 64)

# nn.Linear -> (its weight's identity when packed, the packed weight): one packed copy per module, shared by
# every Target over the model (a batch's slots, calibration's several targets); repacked if the weight changed.
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def zero_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [..., r, H] with zero rows below it, `rows` in all (a call padded to a row count its kernel rounds alike)."""
    return torch.cat((x, x.new_zeros(*x.shape[:-2], rows - x.shape[-2], x.shape[-1])), dim=-2)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch build has oneDNN's packed linear for this dtype on this device."""
    if device.type != "cpu" or dtype not in PACKED_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    supported = (torch.ops.mkldnn._is_mkldnn_bf16_supported() if dtype == torch.bfloat16
                 else torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return bool(supported) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def packs(device: torch.device, dtype: torch.dtype, compiled: bool) -> bool:
    """Whether the target packs its weights: eager forwards on a CPU, where this build can (a compiled
    forward is inductor's to lay out)."""
    return not compiled and can_pack(device, dtype)


class RowKernels:
    """Callables for the target's row-wise modules: the module itself, or its packed twin when `packed`."""

    def __init__(self, packed: bool) -> None:
        self.packed = packed
        # weight shapes whose one-row call is padded to two rows (a batch-invariant target's probe, `Target._rows`);
        # None: none is, and the target pads a one-row call of every module itself where it must
        self.pad_one_row: frozenset[tuple[int, int]] | None = None

    def __call__(self, module: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        if not self.packed:
            return module
        if isinstance(module, torch.nn.Linear) and module.weight.dtype in PACKED_DTYPES:
            return lambda x: self.linear(module, x)
        if (all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn"))
                and module.down_proj.weight.dtype in PACKED_DTYPES):
            return lambda x: self.gated_mlp(module, x)
        return module

    def linear(self, module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        weight = module.weight
        key = (weight.data_ptr(), 0 if weight.is_inference() else weight._version)  # inference tensors have no version
        held = _PACKED.get(module)
        if held is None or held[0] != key:
            held = _PACKED[module] = key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)
        rows = x.shape[-2]
        if self.pad_one_row and rows == 1 and tuple(weight.shape) in self.pad_one_row:
            x = zero_rows(x, 2)
        return torch.ops.mkldnn._linear_pointwise(x, held[1], module.bias, "none", [], "")[..., :rows, :]

    def gated_mlp(self, mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Llama/Qwen's MLP, down(act(gate(x)) * up(x)), as its `forward` computes it."""
        return self.linear(mlp.down_proj, mlp.act_fn(self.linear(mlp.gate_proj, x)) * self.linear(mlp.up_proj, x))

