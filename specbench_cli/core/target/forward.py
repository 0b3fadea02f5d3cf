"""The decoder, written once: the model's own modules (norms, projections, rotary, MLPs, head) around attention
over the static cache, every kind of forward (a prefill, an eager verify or append, the compiled graph) running
it with the backend it was given (`backends.Backend`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specbench_cli.core.kernels import QKV, RowKernels, stacked
from specbench_cli.core.target.backends import Backend, RowWise
from specbench_cli.core.target.rows import Layout, unpack


class Decoder:
    """The decoder over a batch of sequences' rows, for one model and its row kernels (`core.kernels`)."""

    def __init__(self, model: torch.nn.Module, kernels: RowKernels) -> None:
        self.model = model
        self.kernels = kernels
        self.dtype = model.get_input_embeddings().weight.dtype
        self.devices = [block.self_attn.k_proj.weight.device for block in model.model.layers]

    def __call__(self, backend: Backend, embeds: torch.Tensor, positions: torch.Tensor, f: Layout,
                 kv: Callable[[int], torch.Tensor], capture: tuple[int, ...]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """embeds [B, R, H] at `positions` [B, R] (packed, [1, T, H] and [1, T], where `f.real`), laid out as `f`
        says over each layer's cache `kv(layer)` [2, B, kv heads, S, d]: the final-norm hidden states (as the
        inputs come: [B, R, H] or packed) and the outputs of the `capture` layers."""
        base_model = self.model.model
        h = embeds.to(self.dtype)
        cos, sin = base_model.rotary_emb(h, positions)
        if backend.layers is not None:
            h, captured = backend.layers(h, cos, sin, f, kv, capture)
            return base_model.norm(h), captured
        rows, attend = backend.rows, backend.attention.attend
        qkv = self._stacked_qkv if self.kernels.stack else self._qkv  # the kernels' choice (probed; a test may turn it off)
        captured = []
        for i, block in enumerate(base_model.layers):
            if self.devices[i] != h.device:  # --device split: the layer's inputs follow it
                dev = self.devices[i]
                h, cos, sin, f.slots = (t.to(dev) for t in (h, cos, sin, f.slots))
                f.mask = None if f.mask is None else f.mask.to(dev)
            attn = block.self_attn
            q, k, v = qkv(attn, block.input_layernorm(h), cos, sin, rows)
            if f.real is not None:  # packed rows -> each sequence's padded rows (padding rows: zeros, seen by nobody)
                q, k, v = (unpack(t, f.real, *f.slots.shape) for t in (q, k, v))
            out = attend(attn, q, k, v, kv(i), f, i)
            h = h + rows(attn.o_proj, out if f.real is None else out.flatten(0, 1)[f.real][None])
            h = h + rows(block.mlp, block.post_attention_layernorm(h))
            if i in capture:
                captured.append(h)
        return base_model.norm(h), captured

    def head(self, hidden: torch.Tensor, rows: RowWise) -> torch.Tensor:
        head = self.model.get_output_embeddings()
        return rows(head, hidden.to(head.weight.device))

    @staticmethod
    def _stacked_qkv(attn: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     rows: RowWise) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q and k rotated, and v, [B, heads, R, d] each, of x [B, R, H] by one stacked projection
        (`kernels.Stacked`), whose q and k heads, side by side, are rotated in one call unless each is
        normalised first (Qwen3)."""
        d, lead = attn.head_dim, x.shape[:2]
        qkv = stacked(attn, QKV)
        hq, hk = (n // d for n in qkv.sizes[:2])
        heads = rows(qkv, x).view(*lead, -1, d)  # [B, R, q heads + 2 x kv heads, d]
        v = heads[:, :, hq + hk:]
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head before rotary
            q, k = attn.q_norm(heads[:, :, :hq]), attn.k_norm(heads[:, :, hq:hq + hk])
            return rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin), v.transpose(1, 2)
        qk = rotate(heads[:, :, :hq + hk].transpose(1, 2), cos, sin)
        return qk[:, :hq], qk[:, hq:], v.transpose(1, 2)

    @staticmethod
    def _qkv(attn: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             rows: RowWise) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`_stacked_qkv`'s tensors by a projection each."""
        d, lead = attn.head_dim, x.shape[:2]
        q, k, v = (rows(getattr(attn, name), x).view(*lead, -1, d) for name in QKV)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        return rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin), v.transpose(1, 2)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (the rotate-half convention of Llama/Qwen checkpoints); cos/sin are [1, T, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]
