"""The backend a target's masked forwards run on, picked once at start-up (`choose`)."""

from __future__ import annotations

import torch

from specbench_cli.core import decoder_layers
from specbench_cli.core.attention import attends_by_matmul, rows_agree
from specbench_cli.core.kernels import RowKernels
from specbench_cli.core.row_attention import rows_alone
from specbench_cli.core.target.backends import (SDPA, Backend, ExactOrders, KernelRows, OneQueryByMatmul,
                                                   PaddedOneRow, PerRowSDPA, RowBlocks)
from specbench_cli.core.target.cache import StaticKV
from specbench_cli.core.target.compiled import RowsApart
from specbench_cli.core.target.cpu import OneCall, RowKernel
from specbench_cli.core.target.probes import one_call_keeps_rows, one_row_differs, probed, stacks_agree


def choose(model: torch.nn.Module, device: torch.device, kernels: RowKernels, kv: StaticKV, invariant: bool,
           compiled: bool) -> Backend:
    """The backend of a target's masked forwards (verifies, appends), from the device, the dtype, the options and
    what the probes find on this machine; it also settles the kernels' stacking and one-row padding.

    - compiled: `compiled.RowsApart` (grouped attention in the graph, the host writes the cache);
    - the C++ row kernel where it is built for this head dim (half precision on a CPU, and a plain float32
      target: `row_attention.rows_alone`),
      every layer in one C++ call where `decoder_layers.fits` (and a batch-invariant target's GEMMs take a
      verify's rows in one call);
    - batch-invariant elsewhere: `ExactOrders` in half precision on a CPU, else `PerRowSDPA`;
    - plain elsewhere: SDPA, one-query rows by matmul in half precision on a CPU.
    Row-wise work: in one call (plain; batch-invariant where one call keeps every row count from 2 and the
    kernels pad a lone row), a lone row padded to two (where they do not), else ROW_BLOCK pieces."""
    dtype = model.get_input_embeddings().weight.dtype
    first = model.model.layers[0].self_attn.k_proj.weight.device
    if kernels.packed:
        kernels.stack = probed(model, kernels, dtype, first, "stack",
                               lambda: stacks_agree(model, kernels, dtype, first))
    one_call = invariant and probed(model, kernels, dtype, first, "one call",
                                    lambda: one_call_keeps_rows(model, kernels, dtype, first))
    if one_call and kernels.packed:
        kernels.pad_one_row = probed(model, kernels, dtype, first, "one row",
                                     lambda: one_row_differs(model, kernels, dtype))
    if not invariant or (one_call and kernels.pad_one_row is not None):
        rows = KernelRows(kernels)
    else:
        rows = PaddedOneRow(kernels) if one_call else RowBlocks(kernels)
    if compiled:
        return Backend(RowsApart(), rows, invariant=invariant)
    if rows_alone(device, dtype, model.model.layers[0].self_attn.head_dim, plain=not invariant):
        devices = [block.self_attn.k_proj.weight.device for block in model.model.layers]
        fits = (not invariant or one_call) and decoder_layers.fits(model, kernels, devices)
        return Backend(RowKernel(), rows, OneCall(model, kernels, invariant) if fits else None, invariant)
    by_matmul = attends_by_matmul(device, dtype)
    if invariant:
        attention = ExactOrders(kv, len(model.model.layers), rows_agree()) if by_matmul else PerRowSDPA()
        return Backend(attention, rows, invariant=True)
    return Backend(OneQueryByMatmul() if by_matmul else SDPA(), rows)
