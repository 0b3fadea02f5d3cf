"""Start-up probes: what the running machine's GEMM kernels keep bit for bit, measured on the model's own first
layer and head on random rows, once per model, dtype, kernels and device (`probed`). Probed rather than assumed
because the kernels a torch build and a CPU pick may differ; what they find picks the target's row-wise work
(`choose.choose`)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TypeVar

import torch

from specbench_cli.core.host_copy import to_device

from specbench_cli.core.kernels import GATE_UP, QKV, RowKernels, Stacked, shape, stacked
from specbench_cli.core.target.backends import ROW_BLOCK

T = TypeVar("T")
_PROBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(probe, dtype, packed, stack, device): result}


def probed(model: torch.nn.Module, kernels: RowKernels, dtype: torch.dtype, device: torch.device, probe: str,
           measure: Callable[[], T]) -> T:
    """`measure()` once per model, dtype, kernels and device."""
    held = _PROBED.setdefault(model, {})
    key = (probe, dtype, kernels.packed, kernels.stack, str(device))
    if key not in held:
        held[key] = measure()
    return held[key]


def _random_rows(generator: torch.Generator, count: int, width: int, dtype: torch.dtype, device: torch.device,
          scaled: bool = True) -> torch.Tensor:
    x = torch.randn(1, count, width, generator=generator)
    return to_device((x * torch.logspace(-1, 1.5, count)[:, None] if scaled else x).to(dtype), device)


def stacks_agree(model: torch.nn.Module, kernels: RowKernels, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the stacked q/k/v and gate/up calls (`kernels.Stacked`) give every part bit for bit what its own
    call gives, for the first layer on random rows of several counts and scales (the MLP whole, its activation
    reading the stacked output's halves); where not, each linear is called on its own."""
    layer = model.model.layers[0]
    generator = torch.Generator().manual_seed(2)
    attn, width = layer.self_attn, model.config.hidden_size
    for rows in (1, 2, 3, 9, 17, 64):
        x = _random_rows(generator, rows, width, dtype, device)
        with torch.inference_mode():
            qkv, mlp = stacked(attn, QKV), layer.mlp
            apart = [kernels.linear(getattr(attn, name), x) for name in QKV]
            if not all(map(torch.equal, kernels.linear(qkv, x).split(qkv.sizes, dim=-1), apart)):
                return False
            if not torch.equal(kernels.gated_mlp(mlp, x, stack=True), kernels.gated_mlp(mlp, x, stack=False)):
                return False
    return True


def one_call_keeps_rows(model: torch.nn.Module, kernels: RowKernels, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether one call over any number of rows from 2 up gives each row what ROW_BLOCK-row pieces give it, for
    the first layer's projections and MLP and the head, on random rows (then a batch-invariant target pads a
    decode to 2 rows and runs a verify's rows in one call; else it keeps the ROW_BLOCK pieces). With oneDNN's
    packed bf16 linears every count from 2 kept every row, random and wide-range inputs alike, and one row did
    not (a one-row kernel that rounds some outputs otherwise)."""
    layer = model.model.layers[0]
    generator = torch.Generator().manual_seed(0)
    width = model.config.hidden_size
    stacks = [stacked(layer.self_attn, QKV)] if kernels.stack else []
    for module in (layer.self_attn.q_proj, *stacks, layer.mlp, model.get_output_embeddings()):
        fn = kernels(module)
        x = _random_rows(generator, 72, width, dtype, device, scaled=False)
        with torch.inference_mode():
            pieces = torch.cat([fn(p) for p in x.split(ROW_BLOCK, dim=-2)], dim=-2)
            if not all(torch.equal(fn(x[:, :rows]), pieces[:, :rows]) for rows in (2, 3, 9, 17, 33, 72)):
                return False
    return True


def one_row_differs(model: torch.nn.Module, kernels: RowKernels, dtype: torch.dtype) -> frozenset[tuple[int, int]]:
    """The weight shapes (out, in) of the first layer's projections and the head whose packed one-row kernel
    gives some row other than a call over many rows gives it (64 random rows, 16 for the head, over a range of
    scales): the shapes whose one-row calls `RowKernels.pad_one_row` pads to two rows."""
    layer = model.model.layers[0]
    generator = torch.Generator().manual_seed(1)
    linears: list[torch.nn.Linear | Stacked] = [m for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    if kernels.stack:  # the calls a forward makes: q/k/v and gate/up stacked
        linears += [stacked(layer.self_attn, QKV), stacked(layer.mlp, GATE_UP)]
    linears.append(model.get_output_embeddings())
    differs = set()
    for module in linears:
        count = 16 if module is linears[-1] else 64
        device = module.device if isinstance(module, Stacked) else module.weight.device
        x = _random_rows(generator, count, module.in_features, dtype, device)
        with torch.inference_mode():
            many = kernels.linear(module, x)
            if not all(torch.equal(kernels.linear(module, x[:, r:r + 1]), many[:, r:r + 1]) for r in range(count)):
                differs.add(shape(module))
    return frozenset(differs)
