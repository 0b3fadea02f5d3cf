"""Building blocks the model-based drafters share: RMSNorm, rotary embeddings, attention, SwiGLU MLP.

Drafter layers differ from a stock decoder layer in their inputs (EAGLE-3's attention reads 2H features,
DFlash injects context keys/values into every layer), so they are written here in a few lines instead of
bending transformers' classes. Activations are [T, H] and keys/values [heads, T, d], with one more leading
dimension for a batch of sequences ([B, T, H], [B, heads, T, d]; a drafter at --batch-size > 1).
The numerics follow the Llama/Qwen3 reference layers (RMSNorm in fp32, rotate-half RoPE). Linears are
`core.kernels.Linear`: `nn.Linear`'s bits, on packed weights at inference in half precision on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specbench_cli.core.attention import grouped_attention
from specbench_cli.core.host_copy import to_device
from specbench_cli.core.kernels import Linear, linears


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_settings(cfg: dict) -> tuple[float, dict | None]:
    """(theta, scaling) from a config written by either generation of transformers: `rope_theta` beside
    `rope_scaling` (4.x, and the released EAGLE, SpecForge and z-lab configs), or one `rope_parameters` dict
    holding both (5.x: what speculators 0.9 writes). Without either, 10000 and no scaling (Llama's default)."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta") or params.get("rope_theta") or 10000.0
    scaling = cfg.get("rope_scaling")
    if not scaling and params.get("rope_type", params.get("type", "default")) != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return float(theta), scaling or None


class Rotary(nn.Module):
    """cos/sin tables for positions; `scaling` is a transformers rope_scaling dict (e.g. Llama-3's)."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None = None) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if kind not in ("default", None):
            inv_freq = _scaled_inv_freq(head_dim, theta, scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq.to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _scaled_inv_freq(head_dim: int, theta: float, scaling: dict) -> torch.Tensor:
    """Scaled RoPE frequencies through transformers' own initialisers (llama3, linear, yarn ...)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = scaling.get("rope_type", scaling.get("type"))
    config = LlamaConfig(hidden_size=head_dim, num_attention_heads=1, head_dim=head_dim,
                         rope_parameters={**scaling, "rope_type": kind, "rope_theta": theta})
    inv_freq, _ = ROPE_INIT_FUNCTIONS[kind](config, torch.device("cpu"))
    return inv_freq.float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on [(B,) heads, T, d] with cos/sin [(B,) T, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(-3) + rotated * sin.unsqueeze(-3)


class Attention(nn.Module):
    """Grouped-query attention whose q/k/v read `in_dim` features and whose output has `out_dim`.

    `forward` returns the output and this call's (k, v), so the caller decides what to keep in its cache. On a CPU
    q/k/v (k/v alone in `keys_values`) are one packed call (`kernels.linears`)."""

    stacks = (("q_proj", "k_proj", "v_proj"), ("k_proj", "v_proj"))

    def __init__(self, in_dim: int, out_dim: int, heads: int, kv_heads: int, head_dim: int,
                 qk_norm: bool = False, eps: float = 1e-6) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = Linear(in_dim, heads * head_dim, bias=False)
        self.k_proj = Linear(in_dim, kv_heads * head_dim, bias=False)
        self.v_proj = Linear(in_dim, kv_heads * head_dim, bias=False)
        self.o_proj = Linear(heads * head_dim, out_dim, bias=False)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None

    def _heads(self, x: torch.Tensor, n: int, norm: RMSNorm | None) -> torch.Tensor:
        x = x.view(*x.shape[:-1], n, self.head_dim)
        if norm is not None:
            x = norm(x)
        return x.transpose(-3, -2)  # [(B,) heads, T, d]

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._rotated_kv(*linears(self, self.stacks[1], x), cos, sin)

    def _rotated_kv(self, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        k = rotate(self._heads(k, self.kv_heads, self.k_norm), cos, sin)
        return k, self._heads(v, self.kv_heads, None)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | Slots | Apart | None = None, mask: torch.Tensor | None = None,
                extra: tuple[torch.Tensor, torch.Tensor] | None = None,
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Attend from x [(B,) T, in_dim] (rotated by cos/sin [(B,) T, d]) to past + `extra` + this call's keys;
        `past` as `Slots`: this call's keys are written into its buffers and the call attends over them in place;
        as `Apart` (a compiled step): the call reads the whole buffers and attends to its own keys beside them.

        mask: bool [(B,) T, all keys] (True = may attend) or None for full attention."""
        q, k, v = linears(self, self.stacks[0], x)
        q = rotate(self._heads(q, self.heads, self.q_norm), cos, sin)
        k, v = self._rotated_kv(k, v, cos, sin)
        if isinstance(past, Apart):
            assert extra is None, "a compiled step's buffers hold every key it sees"
            return self.o_proj(past.attend(q, k, v, mask).reshape(*x.shape[:-1], -1)), (k, v)
        if isinstance(past, Slots):
            all_k, all_v = past.write(k, v)
        else:
            keys = [kv for kv in (past, extra) if kv is not None] + [(k, v)]
            all_k = torch.cat([kk for kk, _ in keys], dim=-2)
            all_v = torch.cat([vv for _, vv in keys], dim=-2)
        one = x.dim() == 2  # a single sequence: SDPA wants a batch dimension
        out = F.scaled_dot_product_attention(q[None] if one else q, all_k[None] if one else all_k,
                                             all_v[None] if one else all_v,
                                             attn_mask=None if mask is None else mask[None, None] if one else mask[:, None],
                                             enable_gqa=self.heads != self.kv_heads)
        out = out[0] if one else out
        return self.o_proj(out.transpose(-3, -2).reshape(*x.shape[:-1], -1)), (k, v)


class MLP(nn.Module):
    stacks = (("gate_proj", "up_proj"),)  # one packed call on a CPU (`kernels.linears`)

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, bias=False)
        self.up_proj = Linear(hidden, intermediate, bias=False)
        self.down_proj = Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = linears(self, self.stacks[0], x)
        return self.down_proj(F.silu(gate) * up)


def causal_mask(queries: int, past: int, device: torch.device) -> torch.Tensor:
    """bool [queries, past + queries]: every query sees the past and the queries up to itself."""
    q = torch.arange(queries, device=device)[:, None]
    k = torch.arange(past + queries, device=device)[None]
    return k <= q + past


@dataclass
class Slots:
    """Keys/values buffers [(B,) heads, capacity, d] whose first `start` entries are what an attention call sees
    besides its own keys: the call writes its keys at `start` and attends over the buffers up to them, in place
    (no concatenation of the cache per call)."""

    k: torch.Tensor
    v: torch.Tensor
    start: int

    def write(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.start + k.shape[-2]
        self.k[..., self.start:end, :] = k
        self.v[..., self.start:end, :] = v
        return self.k[..., :end, :], self.v[..., :end, :]


@dataclass
class Apart:
    """A compiled draft step's keys/values buffers [B, heads, C, d] (a round's `Slots`, whole): the step reads them
    and leaves them untouched, attending to its own keys beside them, and the caller writes those where they
    belong (`Slots.write`). Why: shapes that do not change from round to round (one graph for every round) and no
    write into a buffer inside the graph (which inductor turns into a copy of it). Its mask is [B, T, C + T]: what
    each query sees of the buffer, then of the call's own keys."""

    k: torch.Tensor
    v: torch.Tensor

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Attention of q [B, heads, T, d] over the buffers and k, v [B, kv heads, T, d]: [B, T, heads, d]."""
        size = self.k.shape[-2]
        parts = [(self.k, self.v, mask[:, None, :, :size]), (k, v, mask[:, None, :, size:])]
        return grouped_attention(q, parts, q.shape[-1] ** -0.5).transpose(1, 2)

    @staticmethod
    def mask(mask: torch.Tensor, slots: Slots) -> torch.Tensor:
        """An eager step's mask [B, T, start + T] over `slots` (their first `start` entries, then the call's own
        keys) as a compiled step's [B, T, C + T]: the entries past `start` unseen."""
        start, size = slots.start, slots.k.shape[-2]
        unseen = mask.new_zeros(*mask.shape[:-1], size - start)
        return torch.cat((mask[..., :start], unseen, mask[..., start:]), -1)


class DraftKV:
    """One sequence's draft keys/values [heads, T, d] in buffers with room after them: appending writes in place
    (the capacity doubles when it runs out), so a round's new entries cost their own size, not the cache's.
    `reserve` leaves room a round may write past the cache (a tree's levels: `round_slots`)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0
        self.least = 0  # the capacity it allocates at least (a compiled drafter's planned one: `fixed`)

    def fixed(self, capacity: int) -> DraftKV:
        """Allocate at least `capacity` entries when the buffers are first made (0: as many as needed, doubling):
        a compiled drafter's round buffers keep one shape while no sequence outgrows them, so its graphs do not
        recompile."""
        self.least = capacity
        return self

    def view(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None if self.k is None else (self.k[:, :self.length], self.v[:, :self.length])

    def reserve(self, rows: int, like: torch.Tensor) -> None:
        """Room for `rows` entries past the cache; `like` [heads, *, d] gives the shape, dtype and device."""
        need = self.length + rows
        if self.k is not None and need <= self.k.shape[1]:
            return
        capacity = max(need, 2 * (0 if self.k is None else self.k.shape[1]), 64, self.least)
        k, v = (like.new_zeros(like.shape[0], capacity, like.shape[2]) for _ in range(2))
        if self.k is not None:
            k[:, :self.length], v[:, :self.length] = self.view()
        self.k, self.v = k, v

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.reserve(k.shape[1], k)
        self.k[:, self.length:self.length + k.shape[1]] = k
        self.v[:, self.length:self.length + k.shape[1]] = v
        self.length += k.shape[1]


def round_slots(caches: list[DraftKV], room: int, like: torch.Tensor) -> tuple[Slots, torch.Tensor]:
    """A round's keys/values for a batch of sequences: their caches [B, heads, longest, d] (zero-padded at the end)
    with `room` free slots after them, as `Slots` starting past the caches, and which entries are real: bool
    [B, longest]. A lone sequence's are its own buffers (no copy): what the round writes past its cache is
    scratch, overwritten by the next round. `like` [heads, *, d]: shape, dtype and device.

    Caches of a fixed capacity (`DraftKV.fixed`, a compiled drafter's) give buffers of that capacity whatever
    their lengths, so that every round's buffers have one shape."""
    longest = max(c.length for c in caches)
    if len(caches) == 1:
        (cache,) = caches
        cache.reserve(room, like)
        real = torch.ones(1, longest, dtype=torch.bool, device=like.device)
        return Slots(cache.k[None], cache.v[None], longest), real
    size = max(longest + room, *(c.least for c in caches))
    k, v = (like.new_zeros(len(caches), like.shape[0], size, like.shape[2]) for _ in range(2))
    for b, cache in enumerate(caches):
        if cache.length:
            k[b, :, :cache.length], v[b, :, :cache.length] = cache.view()
    real = torch.arange(longest, device=like.device)[None] < to_device([c.length for c in caches], like.device)[:, None]
    return Slots(k, v, longest), real
