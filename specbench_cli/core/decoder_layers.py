"""Every decoder layer of an eager CPU forward in one call of a C++ op of ours (`decoder_layers.cpp`).

Why: with its GEMMs on prepacked weights and attention in the row kernel, a bf16 CPU decode of the embedded model
still spent a sizeable share of its time outside both: ~1,500 small PyTorch operators (norms, rotary, cache
writes, casts, the MLP's activation, residual adds) and the Python between them (torch.profiler over decodes at
context 512). The op runs the same layers — the same oneDNN calls on the same packed weights, the same row kernel —
with loops of ours for what lies between, each over one row at a time, so a row's result never depends on the
rows beside it: a batch-invariant target stays exact with it (its one-row GEMMs padded as `RowKernels.pad_one_row`
says). Its norms, rotary and activation round where Hugging Face's modules do but sum and exponentiate in their
own order, so bf16 outputs move by a last bit here and there against the PyTorch forms (float32 runs here only
in a plain target, `kernels.float32_kernels`).

Used for every masked eager forward of a target whose rows the row kernel attends (`target.cpu.RowKernel`)
and whose layers are what the op knows (`fits`): packed and stacked projections (`core.kernels`), SiLU MLPs, one
device. SPECBENCH_DECODER_LAYERS=0 turns it off (A/B: benchmarks/kernel_ab.py --change decoder-layers).
"""

from __future__ import annotations

import os

import torch

from specbench_cli.core.kernels import GATE_UP, QKV, RowKernels, packed, shape, stacked
from specbench_cli.core.row_attention import kernel

def fits(model: torch.nn.Module, kernels: RowKernels, devices: list[torch.device]) -> bool:
    """Whether the op can run this model's layers: packed and stacked projections, SiLU MLPs, rotary over whole
    heads, every layer on one CPU, a kernel that builds, and SPECBENCH_DECODER_LAYERS not 0."""
    layers = model.model.layers
    return (kernels.packed and kernels.stack and len(set(devices)) == 1 and devices[0].type == "cpu"
            and getattr(model.config, "hidden_act", None) == "silu"
            and getattr(model.config, "partial_rotary_factor", 1.0) == 1.0  # the op rotates whole heads
            and all(hasattr(layer.mlp, name) for layer in layers for name in GATE_UP + ("down_proj",))
            and os.environ.get("SPECBENCH_DECODER_LAYERS", "1") != "0" and kernel() is not None)


class DecoderLayers:
    """The op over one model's layers: their packed weights gathered once (again if the first or last layer's
    weights were replaced), called per forward."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        attn = model.model.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = attn.q_proj.out_features // attn.head_dim
        self.kv_heads = attn.k_proj.out_features // attn.head_dim
        self.scale = attn.scaling
        self.eps = model.model.layers[0].input_layernorm.variance_epsilon
        self._held: tuple | None = None  # (check, weights, extras)
        self._shapes: list[tuple[int, int]] = []  # the four GEMMs' weight shapes (out, in), for `pad`

    def _weights(self) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        layers = self.model.model.layers
        check = tuple(layer.self_attn.q_proj.weight.data_ptr() for layer in (layers[0], layers[-1]))
        if self._held is None or self._held[0] != check:
            weights, extras = [], []
            for layer in layers:
                attn, mlp = layer.self_attn, layer.mlp
                gemms = [stacked(attn, QKV), attn.o_proj, stacked(mlp, GATE_UP), mlp.down_proj]
                (qkv, qkv_bias), (o, o_bias), (gate_up, gate_up_bias), (down, down_bias) = map(packed, gemms)
                weights += [layer.input_layernorm.weight, qkv, o, layer.post_attention_layernorm.weight, gate_up, down]
                norms = [getattr(attn, name).weight if hasattr(attn, name) else None for name in ("q_norm", "k_norm")]
                extras += [qkv_bias, o_bias, gate_up_bias, down_bias, *norms]
            self._shapes = [shape(m) for m in gemms]
            self._held = check, [w.detach() for w in weights], [None if e is None else e.detach() for e in extras]
        return self._held[1], self._held[2]

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: list[torch.Tensor],
                 mask: torch.Tensor, place: torch.Tensor, slots: torch.Tensor,
                 pad_one_row: frozenset[tuple[int, int]] | None, capture: tuple[int, ...]
                 ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """h [T, H] (the forward's real rows) through every layer: the hidden states after the last layer [T, H] and
        after each `capture` layer. cos, sin [T, d]: the rows' rotary factors; kv: each layer's cache [2, B, kv
        heads, S, d]; mask bool [B, R, S]: what each of the B sequences' R (padded) rows sees; place [T]: each row's
        index in that B x R layout; slots [T]: its cache slot; `pad_one_row`: the weight shapes whose one-row GEMM
        runs as two rows."""
        weights, extras = self._weights()
        pad = [g for g, s in enumerate(self._shapes) if pad_one_row and s in pad_one_row]
        return torch.ops.specbench.decoder_layers(h, weights, extras, cos, sin, kv, mask, place, slots, self.heads,
                                                  self.kv_heads, self.eps, self.scale, pad, list(capture))
