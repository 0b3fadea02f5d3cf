"""The target's keys and values: one static buffer per device (`StaticKV`) and, for the exact attention of a
batch-invariant target, a float32 copy beside it (`FloatKV`)."""

from __future__ import annotations

import torch


class StaticKV:
    """Preallocated keys and values: one [layers, 2, slots, kv heads, capacity, head dim] buffer per device.

    A slot holds one sequence's cache; a `TargetModel` of B sequences shares one buffer of B slots, each
    slot's `Target` reading and writing its own."""

    def __init__(self, model: torch.nn.Module, slots: int = 1) -> None:
        self.model = model
        self.slots = slots
        self.capacity = 0
        self.buffers: list[torch.Tensor] = []
        self.where: list[tuple[int, int]] = []  # per layer: (buffer, index in it)

    def layer(self, i: int) -> torch.Tensor:
        """Layer i's [2, slots, kv heads, capacity, head dim] view (indexed on every call, so a compiled graph
        reads its static input, the buffer, as it is at each replay)."""
        g, j = self.where[i]
        return self.buffers[g][j]

    def ensure(self, needed: int, keep: int = 0) -> bool:
        """Make room for `needed` positions (rounded up to 256), keeping the first `keep` (every position when
        the buffer has several slots: the others' sequences are not the caller's to drop); True if it reallocated."""
        if needed <= self.capacity:
            return False
        keep = self.capacity if self.slots > 1 else keep
        old = [self.layer(i) for i in range(len(self.where))]
        self.capacity = -(-needed // 256) * 256
        self.buffers = []
        layers = self.model.model.layers
        groups: dict[torch.device, list[int]] = {}
        for i, block in enumerate(layers):
            groups.setdefault(block.self_attn.k_proj.weight.device, []).append(i)
        where: dict[int, tuple[int, int]] = {}
        for device, members in groups.items():
            attn = layers[members[0]].self_attn
            heads = attn.k_proj.out_features // attn.head_dim
            buf = torch.zeros(len(members), 2, self.slots, heads, self.capacity, attn.head_dim,
                              dtype=attn.k_proj.weight.dtype, device=device)
            torch._dynamo.mark_static_address(buf)  # CUDA graphs update it in place instead of copying it
            self.buffers.append(buf)
            where.update({i: (len(self.buffers) - 1, j) for j, i in enumerate(members)})
        self.where = [where[i] for i in range(len(layers))]
        for i, previous in enumerate(old):
            self.layer(i)[..., :keep, :] = previous[..., :keep, :]
        return True

    @torch.no_grad()
    def move(self, src: torch.Tensor, dst: torch.Tensor, slot: int = 0) -> None:
        """In slot `slot`, copy the entries at positions `src` to positions `dst` (one indexing op per device)."""
        for buf in self.buffers:
            s, d = src.to(buf.device), dst.to(buf.device)
            view = buf[:, :, slot]
            view[:, :, :, d] = view[:, :, :, s]

    @torch.no_grad()
    def copy_slot(self, src: int, dst: int, used: int) -> None:
        """Copy slot `src`'s first `used` positions into slot `dst` (a sequence changing slots)."""
        for buf in self.buffers:
            buf[:, :, dst, :, :used] = buf[:, :, src, :, :used]


class FloatKV:
    """A float32 copy of each sequence's cache for `attention.exact_attention`, kept up to date lazily: a forward
    converts its sequence's entries past what the copy already holds (`held`: the committed prefix as of its
    last forward; its own rows and what the last commit moved are past it), and a prefill or a slot copy starts
    the copy over. Entries past a forward's rows are read but masked; the copy holds zeros or older entries
    there, finite either way.

    Why: exact attention reads every key and value it sees in float32, and converting the whole visible cache
    in every layer of every forward was a large share of its time. Memory: twice the bf16 cache, beside it
    (only the exact-attention backend keeps one). Not for a plain target's decode, which reads the cache in
    its own dtype: there reading the copy (a strided view of it) was slower than converting the cache."""

    def __init__(self, cache: StaticKV, layers: int) -> None:
        self.cache = cache
        self.copies: list[torch.Tensor | None] = [None] * layers  # per layer [2, slots, kv heads, capacity, d]
        self.held: dict[int, int] = {}  # slot -> cache positions its copy holds, from 0
        self._shape = (0, 0)  # the cache's (slots, capacity) the copies were made for

    def forget(self, slot: int) -> None:
        self.held[slot] = 0

    def done(self, slot: int, held: int) -> None:
        """A forward of sequence `slot` converted every layer up to its committed prefix, `held` positions."""
        self.held[slot] = held

    def layer(self, layer: int, slot: int, kv: torch.Tensor, filled: int) -> torch.Tensor:
        """Layer `layer`'s keys and values [2, kv heads, capacity, d] of sequence `slot`, its bf16 cache `kv`
        [2, kv heads, S, d] converted up to position `filled` where the copy does not hold it yet."""
        shape = (self.cache.slots, self.cache.capacity)
        if shape != self._shape:  # the cache grew (before this forward): every copy starts over
            self.copies, self.held, self._shape = [None] * len(self.copies), {}, shape
        if self.copies[layer] is None:
            self.copies[layer] = torch.zeros(2, shape[0], kv.shape[1], shape[1], kv.shape[3], device=kv.device)
        copy = self.copies[layer][:, slot]
        start = self.held.get(slot, 0)
        if start < filled:
            copy[:, :, start:filled] = kv[:, :, start:filled]
        return copy
