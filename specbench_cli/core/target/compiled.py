"""The compiled path (`compile=...`): every masked forward of a target model as one graph of static shapes.

Every forward has the shape [slots, bucket]: idle slots run a dummy row nobody keeps, each sequence's rows padded
to the smallest bucket that fits the longest (`DEFAULT_BUCKETS`), attending to the whole buffer, every slot,
through a mask, so that every forward of a bucket has the same shapes and one compiled graph (a CUDA graph
under "reduce-overhead") serves it. The graph only reads the cache: its rows' keys and values come out of it and
the host writes them (`RowsApart`). Padding rows see only themselves and land past the committed length, where
nothing reads them. Prefills stay eager."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from specbench_cli.core.attention import grouped_attention
from specbench_cli.core.compiling import static_graph
from specbench_cli.core.host_copy import to_device
from specbench_cli.core.target.backends import Attention
from specbench_cli.core.target.rows import Layout, Out, Rows, padded, visibility
from specbench_cli.core.tree import DraftTree

DEFAULT_BUCKETS = (1, 4, 16, 64)  # compiled verify sizes (a 60-node tree + root fits 64, a 16-token block 16)


class RowsApart(Attention):
    """The compiled forward's attention, which leaves the cache untouched: each layer's attention reads the
    cache's visible prefix (`Layout.mask`) and the rows' own keys and values (`Layout.block`) side by side
    (`attention.grouped_attention`), and collects those keys and values (`Layout.written`) for the host to write
    after the forward. Why: inductor turns an in-place write into the static cache inside a graph into a copy
    of the whole buffer at every layer, which made a compiled CPU decode many times slower than an eager one."""

    def attend(self, attn, q, k, v, kv, f, layer):
        f.written.append(torch.stack((k, v)))
        out = grouped_attention(q, [(kv[0], kv[1], f.mask), (k, v, f.block[:, None])], attn.scaling)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


class CompiledPath:
    """A target model's compiled forwards: one graph per bucket (and capture set), compiled in `warm_up`, and
    the compile bookkeeping run.json reports (`compile_seconds`, `late_compiles`)."""

    def __init__(self, owner: TargetModel, mode: str) -> None:
        self.owner = owner  # the `model.TargetModel` (not imported: that module imports this one)
        self.mode = mode
        self.compile_seconds: dict[int, float] = {}  # bucket -> seconds its warm-up (compile, record) took
        self.late_compiles: list[int | str] = []  # what compiled outside warm-up (inside a timed round)
        self.warming = False
        self._fn: Callable | None = None

    def bucket(self, rows: int) -> int:
        fits = [b for b in self.owner.buckets if b >= rows]
        return fits[0] if fits else rows  # larger than every bucket: its own size (compiled once, on first use)

    def run(self, work: list[Rows]) -> list[Out]:
        """`TargetModel.run` as one graph over every slot: [slots, bucket] rows (idle slots and padding rows: zero
        inputs that see only themselves); the host writes each busy sequence's rows into the cache afterwards."""
        owner = self.owner
        size, rows = len(owner.slots), self.bucket(max(len(x) for x in work))
        block, sees = padded(work, size, rows, 0)
        embeds = torch.zeros(size, rows, work[0].embeds.shape[-1], dtype=owner.decoder.dtype, device=owner.device)
        positions = torch.zeros(size, rows, dtype=torch.long, device=owner.device)
        base = torch.zeros(size, dtype=torch.long)
        for x in work:
            b, m = x.target.slot, len(x)
            embeds[b, :m], positions[b, :m] = x.embeds, x.positions
            base[b] = x.target.offset + x.target.length
        if self._fn is None:
            self._fn = self.compiled(self.step)
        self.note_bucket(rows)
        device = owner.device
        logits, hidden, captured, written = self._fn(embeds, positions, to_device(block, device),
                                                     to_device(sees, device), to_device(base, device))
        out = []
        for x in work:  # CUDA-graph outputs are overwritten by the next replay: keep copies of what outlives it
            t, m = x.target, len(x)
            self.write(written, t.slot, int(base[t.slot]))
            t.captured = {i: c[t.slot, :m].clone() for i, c in zip(owner._capture, captured)}
            out.append(Out(logits[t.slot, x.heads].clone(), hidden[t.slot, :m].clone()))
        return out

    def step(self, embeds: torch.Tensor, positions: torch.Tensor, block: torch.Tensor, sees_reserved: torch.Tensor,
             base: torch.Tensor):
        """The compiled forward over [slots, bucket] rows: logits, hidden states, captured layers, the rows' keys
        and values (written by the host)."""
        owner = self.owner
        offset = owner.slots[0].offset
        mask = visibility(torch.zeros_like(block), sees_reserved, base, owner.kv.capacity, offset)  # the prefixes
        slots = base[:, None] + torch.arange(block.shape[1], device=block.device)
        f = Layout(mask, slots, sees_reserved, offset=offset, block=block, written=[])
        hidden, captured = owner.decoder(owner.backend, embeds, positions, f, owner.kv.layer, owner._capture)
        return owner.decoder.head(hidden, owner.backend.rows), hidden, captured, torch.stack(f.written)

    def write(self, written: torch.Tensor, slot: int, base: int) -> None:
        """Slot `slot`'s keys and values of a compiled forward ([layers, 2, slots, kv heads, R, d]) into its cache at
        positions base.. (one copy per device's buffer)."""
        rows, kv = written.shape[-2], self.owner.kv
        for g, buf in enumerate(kv.buffers):
            layers = [i for i, (group, _) in enumerate(kv.where) if group == g]
            buf[:, :, slot, :, base:base + rows] = written[layers, :, slot].to(buf.device)

    def compiled(self, fn: Callable) -> Callable:
        """`fn` under torch.compile with this target's mode, static shapes, one graph per bucket."""
        return static_graph(fn, self.mode)

    def note_bucket(self, size: int) -> None:
        """A compiled forward of `size` rows is about to run: one that compiles inside a round is recorded."""
        if size not in self.compile_seconds and not self.warming:
            self.late_compiles.append(size)
            self.compile_seconds[size] = float("nan")

    def cache_grew(self, capacity: int) -> None:
        """The cache was reallocated: the graphs recompile, which is recorded when it happens outside warm-up."""
        if self.compile_seconds and not self.warming:
            self.late_compiles.append(f"cache grown to {capacity}")

    def warm_up(self, sizes: tuple[int, ...] | None = None) -> dict[int, float]:
        """Compile every bucket for every slot now (on throwaway one-token prompts, inside the planned cache), so
        no timed forward pays for it; seconds per bucket."""
        owner = self.owner

        def run(size: int) -> None:
            for t in owner.slots:
                t.prefill([0], room=0)
            owner.verify([(t, 0, DraftTree.chain([0] * (size - 1)), None) for t in owner.slots])

        seconds = self.warm_buckets(sizes or owner.buckets, run)
        for t in owner.slots:
            t.length = 0
        return seconds

    def warm_buckets(self, sizes: tuple[int, ...], run: Callable[[int], None]) -> dict[int, float]:
        """Compile each bucket by calling run(size) three times (CUDA graph trees run eagerly once, record on the
        second call, replay after); seconds per bucket, kept in `compile_seconds`."""
        self.warming = True
        try:
            for size in sizes:
                t0 = time.perf_counter()
                for _ in range(3):
                    run(size)
                if self.owner.device.type == "cuda":
                    torch.cuda.synchronize(self.owner.device)
                self.compile_seconds[size] = time.perf_counter() - t0
        finally:
            self.warming = False
        return dict(self.compile_seconds)
