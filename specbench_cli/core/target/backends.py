"""What a target's forward runs on, chosen once at start-up (`choose.choose`) and called by the decoder
(`forward.Decoder`) without asking which mode the target is in:

- row-wise work, `rows(fn, x)`: a row-wise module (projection, MLP, the head) over rows x [..., H], through the
  target's `core.kernels.RowKernels` (packed CPU weights where it packs them): `KernelRows` (every row count in
  one call), or batch-invariant `PaddedOneRow` / `RowBlocks`;
- attention, `Attention.attend`: the rows' attention over the cache, which it also writes (eager); here the
  PyTorch forms (`SDPA`, `OneQueryByMatmul`, the batch-invariant `PerRowSDPA` and `ExactOrders`, a prefill's
  `Causal`); the C++ row kernel in `cpu.RowKernel`, the compiled forward's in `compiled.RowsApart`;
- optionally every decoder layer in one call (`cpu.OneCall`).

`Backend` holds one of each; its attention's `name` and its layers' are run.json's `attention` and `layers`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from specbench_cli.core.attention import decode_orders, exact_attention, grouped_attention
from specbench_cli.core.kernels import RowKernels, zero_rows
from specbench_cli.core.target.cache import FloatKV, StaticKV
from specbench_cli.core.target.rows import Layout, Rows

ROW_BLOCK = 8  # every GEMM of a batch-invariant target that cannot take its rows in one call takes exactly this many

RowWise = Callable[[Callable[[torch.Tensor], torch.Tensor], torch.Tensor], torch.Tensor]


class Attention:
    """Attention of a forward's rows over the cache. `attend` runs in every layer; an attention that keeps state
    beside the cache (`ExactOrders`) also hears of every eager forward (`prepare`, `done`) and of every sequence
    whose cache starts over (`forget`)."""

    name = "pytorch"  # run.json's `attention`
    exact_trees = False  # with batch-invariant row-wise work, a tree's rows come out as one-token decodes

    def attend(self, attn: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: torch.Tensor,
               f: Layout, layer: int) -> torch.Tensor:
        """q, k, v [B, heads, R, d] (rotated) of the rows laid out as `f` says, over layer `layer`'s cache `kv`
        [2, B, kv heads, S, d] -> [B, R, heads * d]. An eager attention writes k and v at the rows' slots first."""
        raise NotImplementedError

    def prepare(self, f: Layout, kv_len: int) -> int:
        """Before an eager forward laid out as `f` over `kv_len` cache slots: the slots it reads."""
        return kv_len

    def done(self, work: list[Rows]) -> None:
        """After an eager forward of `work`."""

    def forget(self, slot: int) -> None:
        """Slot `slot`'s cache starts over (a prefill, a sequence moving in or out)."""


class Backend:
    """What one kind of forward runs on: its attention, its row-wise work and, where it can, every layer in one
    call (`layers(h, cos, sin, f, kv, capture)`; None: the decoder's layers one module at a time).

    `invariant`: every row computed as a one-row forward computes it, so masked forwards attend over a span
    rounded past the rows' last block (`span`)."""

    def __init__(self, attention: Attention, rows: RowWise, layers: Callable | None = None,
                 invariant: bool = False) -> None:
        self.attention = attention
        self.rows = rows
        self.layers = layers
        self.invariant = invariant
        self.exact_trees = invariant and attention.exact_trees

    def span(self, end: int) -> int:
        """Cache slots a masked eager forward attends over when its rows end at slot `end`.

        Batch-invariant: one 16-slot block past the block holding `end`. With PyTorch's flash kernel for bf16
        attention on a CPU, a row's output changed when the attended span ended inside the 16-slot block of the
        row's last visible slot and was the same for every span past it (measured over 88 prefix lengths), so a
        one-row decode and a verify row at the same position then agree bit for bit. (The row kernel and
        `ExactOrders` read only the keys a row sees; the rounding is kept for every batch-invariant target.)"""
        return -(-end // 16) * 16 + 16 if self.invariant else end


# ------------------------------------------------------------------------------------ row-wise work
class KernelRows:
    """Every row count in one call of the module's kernel (a plain target; every target's prefill; a
    batch-invariant one whose kernels pad a one-row call themselves where it rounds otherwise,
    `RowKernels.pad_one_row`)."""

    name = "one call"  # run.json's `rows`

    def __init__(self, kernels: RowKernels) -> None:
        self.kernels = kernels

    def __call__(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return self.kernels(fn)(x)


class PaddedOneRow(KernelRows):
    """Batch-invariant where one call over any row count from 2 keeps each row's result (`probes.one_call_keeps_rows`)
    and the kernels do not pad (not packed): a single row runs padded to two, other counts in one call."""

    name = "one call, a lone row padded to two"

    def __call__(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        fn = self.kernels(fn)
        if x.shape[:-1].numel() > 1:
            return fn(x)
        lead, x = x.shape[:-1], x.reshape(1, -1, x.shape[-1])
        return fn(zero_rows(x, 2))[..., :1, :].reshape(*lead, -1)


class RowBlocks(KernelRows):
    """Batch-invariant where some row count rounds otherwise: the rows (a batch's [B, R] as one run of B*R) in
    pieces of exactly ROW_BLOCK rows, the last one padded with zero rows, so that every GEMM of every forward, a
    one-token decode's included, has the same shape, kernel and reduction order per row."""

    name = f"blocks of {ROW_BLOCK}"

    def __call__(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        fn = self.kernels(fn)
        lead, x = x.shape[:-1], x.reshape(1, -1, x.shape[-1])
        rows = x.shape[-2]
        if rows % ROW_BLOCK:
            x = zero_rows(x, rows + -rows % ROW_BLOCK)
        out = torch.cat([fn(piece) for piece in x.split(ROW_BLOCK, dim=-2)], dim=-2)[..., :rows, :]
        return out.reshape(*lead, -1)


# ------------------------------------------------------------------------------------ attention: PyTorch
def write(kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """The rows' keys and values k, v [B, kv heads, R, d] into the cache kv [2, B, kv heads, S, d] at `slots` [B, R]."""
    if k.shape[0] == 1:
        kv[0, 0].index_copy_(1, slots[0], k[0])
        kv[1, 0].index_copy_(1, slots[0], v[0])
    else:  # each sequence's rows at its own slots
        lanes = torch.arange(k.shape[0], device=slots.device)[:, None]
        kv[0][lanes, :, slots] = k.transpose(1, 2)
        kv[1][lanes, :, slots] = v.transpose(1, 2)


class Causal(Attention):
    """A prompt's rows over their own slots with plain causality (`Layout.mask` None): SDPA, no mask or score
    matrix for a long prompt."""

    def attend(self, attn, q, k, v, kv, f, layer):
        write(kv, k, v, f.slots)
        out = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=None, is_causal=True, scale=attn.scaling,
                                             enable_gqa=True)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


class SDPA(Attention):
    """PyTorch's SDPA over the masked span (float32 on a CPU, CUDA)."""

    def attend(self, attn, q, k, v, kv, f, layer):
        write(kv, k, v, f.slots)
        out = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=f.mask, is_causal=False, scale=attn.scaling,
                                             enable_gqa=True)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


class OneQueryByMatmul(SDPA):
    """SDPA, but one-query rows (a decode) as `attention.grouped_attention`'s batched matmuls: half precision on a
    CPU without the row kernel, where SDPA's one-query kernel is slow (`attention.attends_by_matmul`)."""

    def attend(self, attn, q, k, v, kv, f, layer):
        if q.shape[2] != 1:
            return super().attend(attn, q, k, v, kv, f, layer)
        write(kv, k, v, f.slots)
        out = grouped_attention(q, [(kv[0], kv[1], f.mask)], attn.scaling)
        return out.transpose(1, 2).reshape(q.shape[0], 1, -1)


class PerRowSDPA(Attention):
    """Batch-invariant where SDPA attends (float32, CUDA): each row its own SDPA problem in one batched call, over
    the sequence's common span (`Backend.span`), so a row's result does not depend on the rows beside it; rows
    that do not see reserved entries attend over the cache after them, as if there were none. Exact for a
    chain only: a tree node's ancestors sit at other slots than a decode puts them (`TargetModel.verify_paths`)."""

    def attend(self, attn, q, k, v, kv, f, layer):
        write(kv, k, v, f.slots)
        return torch.cat([self._sequence(q[b:b + 1], kv[:, b], f.mask[b, 0], attn.scaling, f.sees_reserved[b],
                                         f.offset) for b in range(q.shape[0])])

    @staticmethod
    def _sequence(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, scale: float, sees_reserved: torch.Tensor,
                  offset: int) -> torch.Tensor:
        """One sequence's rows q [1, heads, rows, d] over its cache kv [2, kv heads, S, d] -> [1, rows, heads * d]."""
        rows, r = q.shape[2], offset
        groups = [(torch.arange(rows, device=q.device), 0)] if not r else [
            (torch.nonzero(~sees_reserved).flatten(), r), (torch.nonzero(sees_reserved).flatten(), 0)]
        out = q.new_empty(rows, q.shape[1], 1, q.shape[3])
        for idx, first in groups:
            if not len(idx):
                continue
            keys, values = (kv[j, :, first:][None].expand(len(idx), -1, -1, -1) for j in (0, 1))
            out[idx] = F.scaled_dot_product_attention(q[0, :, idx].transpose(0, 1)[:, :, None], keys, values,
                                                      attn_mask=mask[idx, first:][:, None, None], scale=scale,
                                                      enable_gqa=True)
        return out.reshape(1, rows, -1)


class ExactOrders(Attention):
    """Batch-invariant in half precision on a CPU where the row kernel is not built: `attention.exact_attention`,
    every row over its keys in the order the one-token decode at its position reads them (a tree node's ancestors
    included, so a tree's rows are exact too), from the float32 copy of the cache `FloatKV`. `one_call`
    (`attention.rows_agree`, probed): all rows of a sequence in a few calls, else each row its own."""

    exact_trees = True

    def __init__(self, cache: StaticKV, layers: int, one_call: bool) -> None:
        self.float_kv = FloatKV(cache, layers)
        self.one_call = one_call

    def prepare(self, f: Layout, kv_len: int) -> int:
        f.orders = decode_orders(f.mask, f.sees_reserved, f.slots, f.offset)
        return max(kv_len, *(order.end for order in f.orders))  # each row reads its whole last block (masked)

    def attend(self, attn, q, k, v, kv, f, layer):
        write(kv, k, v, f.slots)
        out = []
        for b, order in enumerate(f.orders):
            keys, values = self.float_kv.layer(layer, f.first_slot + b, kv[:, b], order.filled)
            rows = exact_attention(q[b:b + 1], keys, values, order, attn.scaling, self.one_call)
            out.append(rows.transpose(1, 2).reshape(1, rows.shape[2], -1))
        return torch.cat(out)

    def done(self, work: list[Rows]) -> None:
        for x in work:  # every layer's float copy now holds each sequence's committed prefix
            self.float_kv.done(x.target.slot, x.target.offset + x.target.length)

    def forget(self, slot: int) -> None:
        self.float_kv.forget(slot)
