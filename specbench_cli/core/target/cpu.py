"""The CPU kernel backend: attention by the C++ row kernel (`core.row_attention`) and every decoder layer in one
C++ call (`core.decoder_layers`), for eager targets in half precision on a CPU where the kernel builds (a plain
float32 target too unless SPECBENCH_FP32_KERNELS=0, `core.kernels.float32_kernels`).

Why: there a decode's attention as PyTorch operators (float32 casts of the cached keys and values, two matmuls,
mask, softmax, each layer) and the small operators and Python between the GEMMs were a large share of its time;
and the kernel computes each row alone over the keys its mask row shows, in slot order, so a batch-invariant
target's rows, tree nodes included, are the one-token decodes of their paths by construction."""

from __future__ import annotations

import torch

from specbench_cli.core.decoder_layers import DecoderLayers
from specbench_cli.core.kernels import RowKernels
from specbench_cli.core.row_attention import row_attention
from specbench_cli.core.target.backends import Attention, write


class RowKernel(Attention):
    """Every row of a masked forward (a decode's one, a verify's many) alone through the row kernel."""

    name = "row kernel"
    exact_trees = True

    def attend(self, attn, q, k, v, kv, f, layer):
        write(kv, k, v, f.slots)
        return row_attention(q, kv[0], kv[1], f.mask[:, 0], attn.scaling)


class OneCall:
    """Every decoder layer of a masked eager forward in one call of `core.decoder_layers` (the same GEMMs on the
    same packed weights, the same row kernel); a batch-invariant target's one-row GEMMs padded as its kernels
    say (`RowKernels.pad_one_row`)."""

    name = "one call"  # run.json's `layers`

    def __init__(self, model: torch.nn.Module, kernels: RowKernels, invariant: bool) -> None:
        self.op = DecoderLayers(model)
        self.num_layers = len(model.model.layers)
        self.pad_one_row = kernels.pad_one_row if invariant else None

    def __call__(self, h, cos, sin, f, kv, capture):
        """h [1, T, H] (packed rows where `f.real`) through every layer: [1, T, H] after the last layer, and the
        captured layers' outputs."""
        if f.real is None:  # one sequence, its rows as they are
            place = torch.arange(h.shape[1], device=h.device)
            slots = f.slots[0]
        else:
            place = f.real
            slots = f.slots.flatten()[f.real]
        out, captured = self.op(h[0], cos[0], sin[0], [kv(i) for i in range(self.num_layers)], f.mask[:, 0], place,
                                slots.contiguous(), self.pad_one_row, capture)
        return out[None], [c[None] for c in captured]
