"""The target: the verifying model over one preallocated KV cache of one or more sequences.

`TargetModel` holds the model, the cache and the one forward, `run(rows)`, over the rows of any sequences in
consecutive slots; each sequence is a `Target`: prefill(ids) -> logits of the next token; verify(root, tree) ->
logits of every tree node in one forward with an ancestor mask and depth-based positions; commit(path) -> the
accepted path's cache entries moved into place; forward(tokens) -> a plain append, for methods that need an extra
target forward. `TargetModel.verify` verifies many sequences' trees in one forward (the loop's batch).

The forward is ours, run over the model's own modules (embeddings, norms, projections, rotary, MLPs, head),
so that the cache can be static, as in gpt-fast: one buffer per device, [layers, 2, slots, kv heads, capacity,
head dim], allocated once and grown only when a prompt needs more. A forward writes its rows in place at the
slots after each sequence's committed length and attends through a boolean mask:

- eager: to the valid prefix and its own rows only (a slice of the buffer; a batch's trees padded to the largest);
- compiled (`compile=...`): to the whole buffer, every slot, with rows padded to a bucket size, so that every
  forward of a bucket has the same shapes and one compiled graph (a CUDA graph under "reduce-overhead")
  serves it. The graph only reads the cache: its rows' keys and values come out of it and the host writes
  them (`RowsApart`). Padding rows see only themselves and land past the committed length, where nothing
  reads them.

The extension points, all generic (this module names no method):
- `capture(layers)`: a drafter that reads target features asks for decoder layers' outputs; every forward
  then leaves them in `captured`.
- `VerifyExtras` on a verify: side rows (inputs given as embeddings that see the prefix, the tree nodes
  they are allowed and themselves, and that nothing attends to) whose hidden states come back beside the
  tree's logits, and `root_logits` when an earlier `forward` already cached the root.
- `reserve(n)`: entries at the front of the cache that only side rows see (a learned soft prompt).
- `forward(tokens)`: a plain append outside verify, for a method that needs target forwards of its own.

Batch-invariant (`invariant=True`, eager): every row of a verify is computed bit for bit as a
one-token decode computes it (`_rows`: GEMMs whose rounding does not depend on the row count; attention one row
at a time over the keys it sees, in the order that decode reads them: the row kernel `core.row_attention`, or
where it is not built `attention.exact_attention` on the float copy `FloatKV`), so that in bf16 a method's
greedy output equals plain one-token decoding's. The plain target attends with the row kernel too (a decode's one
row was a third of a CPU decode as PyTorch operators). Wherever the row kernel attends, every decoder layer runs in
one C++ call (`core.decoder_layers`: the same GEMMs and kernel, the glue between them row by row). Where attention
runs through SDPA instead (float32, CUDA: one-query problems over a common span, `_kv_span`) a tree's rows are not
exact, and its accepted path is verified again as a chain (`verify_paths`, `exact_trees` False).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F

from specbench_cli.core.attention import (DecodeOrder, attends_by_matmul, decode_orders, exact_attention,
                                          grouped_attention, one_query_by_matmul, rows_agree)
from specbench_cli.core import decoder_layers
from specbench_cli.core.errors import UsageError
from specbench_cli.core.kernels import GATE_UP, QKV, RowKernels, Stacked, packs, shape, stacked, zero_rows
from specbench_cli.core.row_attention import row_attention, rows_alone
from specbench_cli.core.tree import DraftTree

# Families whose decoder layers this forward reproduces: pre-norm residual blocks, rotary attention with
# optional per-head q/k RMSNorm (Qwen3) and biases (Qwen2), full attention in every layer.
SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")
ROOM = 256  # cache slots kept free past prompt + max-new-tokens for the largest verify (grown if a tree needs more)
DEFAULT_BUCKETS = (1, 4, 16, 64)  # compiled verify sizes (a 60-node tree + root fits 64, a 16-token block 16)
ROW_BLOCK = 8  # every batch-invariant GEMM takes exactly this many rows (see `Target._rows`)
T = TypeVar("T")
_PROBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(probe, dtype, packed, device): result}


@dataclass
class SideTokens:
    """Rows that ride along in a verify forward without changing the tree's logits."""

    embeds: torch.Tensor  # [M, H] input embeddings
    positions: torch.Tensor  # [M] position offsets from the committed length
    attend: torch.Tensor  # bool [M, N+1]: which of root + nodes each side row sees

    def __len__(self) -> int:
        return self.embeds.shape[0]


@dataclass
class VerifyExtras:
    """What a proposer may add to the target's verify forward."""

    side: SideTokens | None = None
    root_logits: torch.Tensor | None = None  # the root is already cached (by `forward`); these are its logits


@dataclass
class RowsApart:
    """A forward that leaves the cache untouched (the compiled one): each layer's attention reads the cache's
    visible prefix and the rows' own keys and values side by side, and collects those keys and values for
    the host to write after the forward. Why: inductor turns an in-place write into the static cache inside a
    graph into a copy of the whole buffer at every layer (a compiled CPU decode took 0.9 s against 31 ms)."""

    block: torch.Tensor  # bool [B, R, R]: which of its sequence's rows each row sees
    written: list[torch.Tensor]  # per layer, [2, B, kv heads, R, d]


def check_supported(model: torch.nn.Module) -> None:
    kind = getattr(model.config, "model_type", "?")
    layers = model.model.layers if kind in SUPPORTED else []
    windowed = [i for i, block in enumerate(layers) if getattr(block.self_attn, "sliding_window", None)]
    if kind not in SUPPORTED or windowed:
        why = f"sliding-window layers {windowed[:3]}" if windowed else f"model type '{kind}'"
        raise UsageError(f"the target's {why} is not supported by specbench's engine (it runs {', '.join(SUPPORTED)} "
                         "models with full attention)")


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

    Why: converting a decode's 512 cached keys and values from bf16 in every layer cost 30 us of its 170 us
    of attention (2-core EPYC). Memory: twice the bf16 cache, beside it (exact targets only: half precision on
    a CPU). Not for a plain target's decode: reading the copy (a strided view of it) made that decode 4 % slower
    than converting its cache in every layer (2-core EPYC, 2026-11-27, medians of 6 x 25 decodes)."""

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


@dataclass
class Rows:
    """One sequence's rows in a forward (`TargetModel.run`): their inputs, positions and what each row sees."""

    target: Target  # the sequence (its slot, committed length and reserved entries say where the rows go)
    embeds: torch.Tensor  # [n, H] input embeddings
    positions: torch.Tensor  # [n] absolute positions, on the device
    block: torch.Tensor | None  # bool [n, n]: which of these rows each row sees; None: plain causality (a prefill)
    sees_reserved: torch.Tensor  # bool [n]: the rows that see the reserved entries (side rows)
    heads: slice  # the rows whose logits are wanted

    def __len__(self) -> int:
        return self.embeds.shape[0]


@dataclass
class Out:
    """What a forward gives one sequence: the logits of its `heads` rows and every row's final hidden state."""

    logits: torch.Tensor
    hidden: torch.Tensor


class TargetModel:
    """The verifying model over one static cache of `slots` sequences, and its one forward, `run`.

    Each sequence is a `Target` (its slot of the cache, its committed length, its captured features); a single
    sequence is a one-slot target model (`Target(model, device)` makes one). `run` takes the rows of any
    sequences in consecutive slots — a prefill, a verify with or without side rows, an append — eager or
    compiled through the same function: the row-wise parts (projections, MLP, head) over the rows alone,
    packed, attention over each sequence's cache with its rows padded to the longest.

    Compiled (`compile`): every forward has the shape [slots, bucket]: idle slots run a dummy row nobody
    keeps, each sequence's rows padded to the smallest bucket that fits the longest; the graph only reads the
    cache and the host writes the busy sequences' rows after it (`RowsApart`). One graph per bucket."""

    def __init__(self, model: torch.nn.Module, device: torch.device, compile: str | None = None,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS, invariant: bool = False, slots: int = 1,
                 packed: bool | None = None) -> None:
        """`packed`: projections, MLPs and head on prepacked CPU weights (`core.kernels`; None: wherever
        `kernels.packs` says they can be)."""
        check_supported(model)
        self.model = model
        self.device = device
        self.invariant = invariant  # every row computed as a one-row forward computes it (see `_kv_span`)
        self.kv = StaticKV(model, 0)
        self.slots: list[Target] = []
        self._capture: tuple[int, ...] = ()  # decoder layers every forward returns (what the sequences asked for)
        self._dtype = model.get_input_embeddings().weight.dtype
        # eager attention one row at a time (`core.row_attention`): a decode's, and a batch-invariant verify's every row
        self.rows_alone = rows_alone(device, self._dtype, model.model.layers[0].self_attn.head_dim)
        # where a tree's rows are exact too (the row kernel, or `attention.exact_attention` where it is not built);
        # elsewhere its accepted path is verified again
        self.exact_trees = invariant and attends_by_matmul(device, self._dtype)
        exact_by_orders = self.exact_trees and not self.rows_alone
        self.rows_agree = exact_by_orders and rows_agree()  # all rows of a verify in one call (else one each)
        self.float_kv = FloatKV(self.kv, self.num_layers) if exact_by_orders else None
        self.kernels = RowKernels(packs(device, self._dtype, compile is not None) if packed is None else packed)
        self._layer_devices = [block.self_attn.k_proj.weight.device for block in model.model.layers]
        self.one_call = False  # see `_rows`; probed once per model, dtype and kernels
        self._prefilling = False  # a prompt's forward: its rows need not be computed as one-row decodes (`_prefill`)
        if self.kernels.packed:
            self.kernels.stack = self._probed("stack", self._stacks_agree)
        if invariant:
            self.one_call = self._probed("one call", self._one_call_keeps_rows)
            if self.one_call and self.kernels.packed:
                self.kernels.pad_one_row = self._probed("one row", self._one_row_differs)
        # every layer of a forward the row kernel attends in one C++ call (`core.decoder_layers`)
        eligible = self.rows_alone and compile is None and (not invariant or self.one_call)
        self.layers_op = (decoder_layers.DecoderLayers(model)
                          if eligible and decoder_layers.fits(model, self.kernels, self._layer_devices) else None)
        self.compile_mode = compile
        self.buckets = tuple(sorted(buckets))
        self.compile_seconds: dict[int, float] = {}  # bucket -> seconds its warm-up (compile, record) took
        self.late_compiles: list[int | str] = []  # what compiled outside warm-up (inside a timed round)
        self._warming = False
        self._compiled: Callable | None = None
        for _ in range(slots):
            Target(model, device, shared=self)

    def join(self, target: Target) -> int:
        """A sequence takes the next slot (before the cache is first allocated); its slot number."""
        if self.kv.capacity:
            raise RuntimeError("sequences join a target model before its cache is allocated")
        self.slots.append(target)
        self.kv.slots = len(self.slots)
        return len(self.slots) - 1

    @property
    def attention(self) -> str:
        """What attends in an eager forward (run.json's `attention`): "row kernel" (`core.row_attention`, every row of
        a masked forward; a prefill keeps SDPA), else "pytorch" (`core.attention`, SDPA)."""
        return "row kernel" if self.rows_alone else "pytorch"

    @property
    def layers(self) -> str:
        """How an eager forward the row kernel attends runs its decoder layers (run.json's `layers`): "one call"
        (`core.decoder_layers`), else "pytorch" (PyTorch operators, one module at a time)."""
        return "one call" if self.layers_op is not None else "pytorch"

    @property
    def num_layers(self) -> int:
        return len(self.model.model.layers)

    def plan(self, tokens: int) -> None:
        """Size the cache for sequences of up to `tokens` positions before anything is timed (a compiled run
        does this before warming up, so no timed forward meets a reallocation and its recompile)."""
        self.grow(self.slots[0].offset + tokens, keep=0)

    def grow(self, tokens: int, keep: int) -> None:
        """Room for `tokens` cache entries plus a full verify's rows, keeping the first `keep` (every entry when
        the cache has several slots); a compiled target that has to grow recompiles, which is recorded
        (`late_compiles`) when it happens outside warm-up."""
        grew = self.kv.ensure(tokens + max(self.buckets[-1], ROOM) + ROOM, keep=keep)
        if grew and self.compile_mode is not None and self.compile_seconds and not self._warming:
            self.late_compiles.append(f"cache grown to {self.kv.capacity}")

    # ------------------------------------------------------------------------------------ the forward
    @torch.inference_mode()
    def run(self, work: list[Rows]) -> list[Out]:
        """The one forward: every sequence's rows of `work` (sequences in consecutive slots), written at the slots
        after its committed length. A row sees its sequence's committed prefix, the reserved entries if it
        `sees_reserved`, and the rows its `block` row allows."""
        if all(len(x) == 0 for x in work):  # nothing to run (a cached root with an empty draft)
            return [Out(x.embeds.new_empty(0, 0), x.embeds) for x in work]
        for x in work:
            t = x.target
            self.grow(t.offset + t.length + len(x), keep=t.offset + t.length)
            t.forwards += 1
        if work[0].block is None:
            assert len(work) == 1, "a prefill runs alone"
            return [self._prefill(work[0])]
        return self._run_compiled(work) if self.compile_mode is not None else self._run_eager(work)

    @torch.inference_mode()
    def verify(self, work: list[tuple[Target, int, DraftTree, VerifyExtras | None]]) -> list[torch.Tensor]:
        """(sequence, root, tree, extras) -> logits [1 + nodes, V] per sequence, in one forward (`Target.verify`)."""
        rows = [t.verify_rows(root, tree, extras) for t, root, tree, extras in work]
        return [t.verified(x, out, extras) for (t, _, _, extras), x, out in zip(work, rows, self.run(rows))]

    @torch.inference_mode()
    def verify_paths(self, work: list[tuple[Target, int, DraftTree, list[int]]]) -> list[tuple[DraftTree, torch.Tensor]]:
        """Each tree's accepted path (node indices, root first) verified again as a chain, in one forward: the
        chains and their logits [len(path), V].

        A batch-invariant target computes a chain's rows exactly as one-token decodes, but not a tree's: the
        CPU attention kernel's result depends on where in the cache a row's visible entries sit (its vector
        lanes follow the slot), and a tree node's ancestors are not at the slots a decode puts them. So greedy
        decoding of a tree verifies the accepted path again, as a chain. Side rows of the tree's verify stay,
        re-indexed to the chain's nodes (drafters read them; they need not be exact)."""
        sides = [t.side_hidden for t, *_ in work]
        chains = [tree.along(path) for _, _, tree, path in work]
        logits = self.verify([(t, root, chain, None) for (t, root, _, _), chain in zip(work, chains)])
        for (t, _, _, path), side in zip(work, sides):
            t.side_hidden = None if side is None else side[path]
        return list(zip(chains, logits))

    def _prefill(self, x: Rows) -> Out:
        """A prompt's rows see only themselves, causally, after any reserved entries: attention spans their own
        slots with plain causality (no [n, n] mask or score matrix for a long prompt, and the same computation
        with or without reserved entries in front). A batch-invariant target runs them as the plain one does
        (every row-wise module in one call): no decode ever recomputes a prompt's rows, so what the invariance
        needs is only that every target prefills alike — and so a plain run's prompt cache and first token are
        bit for bit the batch-invariant replay's (greedy_replay.py), which in float32 also costs half the time
        of 8-row pieces."""
        t, rows = x.target, len(x)
        base = t.offset + t.length
        self._prefilling = True
        try:
            hidden, captured = self.decoder(x.embeds[None], x.positions[None], None,
                                            torch.arange(rows, device=self.device)[None],
                                            x.sees_reserved[None].to(self.device),
                                            lambda i: self.kv.layer(i)[:, t.slot:t.slot + 1, :, base:base + rows])
            return self._outputs([x], [hidden[0]], [[c[0]] for c in captured])[0]
        finally:
            self._prefilling = False

    def _run_eager(self, work: list[Rows]) -> list[Out]:
        first, n = work[0].target.slot, len(work)
        assert [x.target.slot for x in work] == list(range(first, first + n)), "sequences in consecutive slots"
        offset = _one_offset(work)
        sizes = [len(x) for x in work]
        rows = max(sizes)
        block, sees = _padded(work, n, rows, first)
        base = torch.tensor([x.target.offset + x.target.length for x in work])
        kv_len = self._kv_span(int(base.max()) + rows)
        device = self.device
        base, block, sees = base.to(device), block.to(device), sees.to(device)
        mask = self.visibility(block, sees, base, kv_len, offset)
        slots = base[:, None] + torch.arange(rows, device=device)
        # one sequence: its rows as they are; several: packed (row-wise parts on real rows only)
        real = None if n == 1 else (torch.arange(rows)[None] < torch.tensor(sizes)[:, None]).to(device)
        embeds = torch.cat([x.embeds for x in work])[None]
        positions = torch.cat([x.positions for x in work])[None]
        orders = decode_orders(mask, sees, slots, offset) if self.float_kv is not None else None
        if orders:  # each row reads its whole last block (masked past what it sees)
            kv_len = max(kv_len, *(order.end for order in orders))
        hidden, captured = self.decoder(embeds, positions, mask, slots, sees,
                                        lambda i: self.kv.layer(i)[:, first:first + n, :, :kv_len], real, offset=offset,
                                        orders=orders, first_slot=first)
        if orders:  # every layer's float copy now holds each sequence's committed prefix
            for x in work:
                self.float_kv.done(x.target.slot, x.target.offset + x.target.length)
        return self._outputs(work, list(hidden[0].split(sizes)), [c[0].split(sizes) for c in captured])

    def _outputs(self, work: list[Rows], hidden: list[torch.Tensor], captured: list) -> list[Out]:
        """Logits of each sequence's `heads` rows (one head call for all), its captured layers kept on it."""
        heads = [h[x.heads] for x, h in zip(work, hidden)]
        logits = [self._head(heads[0])] if len(work) == 1 else self._head(torch.cat(heads)).split([len(h) for h in heads])
        for b, x in enumerate(work):
            x.target.captured = {i: c[b] for i, c in zip(self._capture, captured)}
        return [Out(lg, h) for lg, h in zip(logits, hidden)]

    def visibility(self, block: torch.Tensor, sees_reserved: torch.Tensor, base: torch.Tensor,
                   kv_len: int, offset: int = 0) -> torch.Tensor:
        """Boolean [B, 1, rows, kv_len] mask of which cache slots each row of each sequence attends to, for
        sequences whose rows `block` [B, rows, rows] sit at slots base [B] onwards, after `offset` reserved entries."""
        batch, rows, r = block.shape[0], block.shape[1], offset
        cols = torch.arange(kv_len, device=block.device)[None, None]
        rel = cols - base[:, None, None]
        prefix = (rel < 0) & ((cols >= r) | sees_reserved[:, :, None])
        own = ((rel >= 0) & (rel < rows)) & block.gather(2, rel.clamp(0, rows - 1).expand(batch, rows, kv_len))
        return (prefix | own)[:, None]

    def decoder(self, embeds: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, slots: torch.Tensor,
                sees_reserved: torch.Tensor, kv: Callable[[int], torch.Tensor],
                real: torch.Tensor | None = None, apart: RowsApart | None = None,
                offset: int = 0, orders: list[DecodeOrder] | None = None,
                first_slot: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The decoder over a batch of sequences' rows: embeds [B, R, H] at `positions` [B, R], each written at
        `slots` [B, R] of its sequence's cache `kv(layer)` [2, B, kv heads, S, d] and attending where `mask`
        [B, 1, R, S] allows (None: plain causal attention over the rows). Returns the final-norm hidden states
        [B, R, H] and the captured layers' outputs.

        `real` (bool [B, R]): the rows are packed, embeds [1, T, H] and positions [1, T] holding only the rows
        `real` marks, in order; every row-wise part (norms, projections, MLP) runs on them alone and only
        attention sees the padded [B, R] layout. Hidden states come back packed too. `offset`: reserved entries
        at the front of each sequence's cache. `orders`: each row's keys in the order a one-token decode reads
        them (`attention.decode_orders`; batch-invariant targets), the sequences in slots `first_slot` on."""
        base_model = self.model.model
        h = embeds.to(self._dtype)
        cos, sin = base_model.rotary_emb(h, positions)
        if self.layers_op is not None and mask is not None and apart is None:
            h, captured = self._layers_at_once(h, cos, sin, mask, slots, kv, real)
            return base_model.norm(h), captured
        captured = []
        for i, block_module in enumerate(base_model.layers):
            if self._layer_devices[i] != h.device:  # --device split: the layer's inputs follow it
                dev = self._layer_devices[i]
                h, cos, sin, slots = (t.to(dev) for t in (h, cos, sin, slots))
                mask = None if mask is None else mask.to(dev)
            h = h + self._attention(block_module.self_attn, block_module.input_layernorm(h), cos, sin, mask, slots,
                                    kv(i), sees_reserved, real, apart, offset, orders, (i, first_slot))
            h = h + self._rows(block_module.mlp, block_module.post_attention_layernorm(h))
            if i in self._capture:
                captured.append(h)
        return base_model.norm(h), captured

    def _attention(self, attn: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   mask: torch.Tensor | None, slots: torch.Tensor, kv: torch.Tensor,
                   sees_reserved: torch.Tensor, real: torch.Tensor | None = None,
                   apart: RowsApart | None = None, offset: int = 0,
                   orders: list[DecodeOrder] | None = None, where: tuple[int, int] = (0, 0)) -> torch.Tensor:
        """One attention block over x [B, R, H] (or packed rows, `decoder`'s `real`), reading and writing the static
        cache `kv` [2, B, kv heads, S, d] (reading only, with `apart`). `where`: (layer, slot of the first sequence),
        for the float copy exact attention reads (`FloatKV`)."""
        q, k, v = self._rotated_qkv(attn, x, cos, sin)
        if real is not None:  # packed rows -> each sequence's padded rows (padding rows: zeros, seen by nobody)
            q, k, v = (unpack(t, real) for t in (q, k, v))
        batch, rows = q.shape[0], q.shape[2]
        if apart is not None:
            apart.written.append(torch.stack((k, v)))
            out = grouped_attention(q, [(kv[0], kv[1], mask), (k, v, apart.block[:, None])], attn.scaling)
            out = out.transpose(1, 2).reshape(batch, rows, -1)
            return self._rows(attn.o_proj, out if real is None else out[real][None])
        if batch == 1:
            kv[0, 0].index_copy_(1, slots[0], k[0])
            kv[1, 0].index_copy_(1, slots[0], v[0])
        else:  # each sequence's rows at its own slots
            lanes = torch.arange(batch, device=slots.device)[:, None]
            kv[0][lanes, :, slots] = k.transpose(1, 2)
            kv[1][lanes, :, slots] = v.transpose(1, 2)
        if mask is not None and self.rows_alone:
            out = row_attention(q, kv[0], kv[1], mask[:, 0], attn.scaling)
        elif self.invariant and mask is not None:
            out = torch.cat([self._one_query_each(q[b:b + 1], kv[:, b], mask[b, 0], attn.scaling, sees_reserved[b],
                                                  slots[b], offset, orders[b] if orders else None,
                                                  (where[0], where[1] + b))
                             for b in range(batch)])
        elif mask is not None and rows == 1 and one_query_by_matmul(q):
            out = grouped_attention(q, [(kv[0], kv[1], mask)], attn.scaling).transpose(1, 2).reshape(batch, rows, -1)
        else:
            out = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask, is_causal=mask is None,
                                                 scale=attn.scaling, enable_gqa=True).transpose(1, 2).reshape(batch, rows, -1)
        return self._rows(attn.o_proj, out if real is None else out[real][None])

    def _layers_at_once(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                        slots: torch.Tensor, kv: Callable[[int], torch.Tensor], real: torch.Tensor | None
                        ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`decoder`'s layers in one call of `core.decoder_layers` over h [1, T, H] (packed rows where `real`):
        [1, T, H] after the last layer, and the captured layers' outputs."""
        if real is None:  # one sequence, its rows as they are
            place = torch.arange(h.shape[1], device=h.device)
            slots = slots[0]
        else:
            place = real.flatten().nonzero().flatten()
            slots = slots[real]
        out, captured = self.layers_op(h[0], cos[0], sin[0], [kv(i) for i in range(self.num_layers)], mask[:, 0],
                                       place, slots.contiguous(), self.kernels.pad_one_row if self.invariant else None,
                                       self._capture)
        return out[None], [c[None] for c in captured]

    def _rotated_qkv(self, attn: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q and k rotated, and v, [B, heads, R, d] each, of x [B, R, H]: one stacked projection where the kernels
        stack (`kernels.Stacked`), whose q and k heads, side by side, are rotated in one call unless each is
        normalised first (Qwen3); else a projection each."""
        d, lead = attn.head_dim, x.shape[:2]
        if self.kernels.stack:
            qkv = stacked(attn, QKV)
            hq, hk = (n // d for n in qkv.sizes[:2])
            heads = self._rows(qkv, x).view(*lead, -1, d)  # [B, R, q heads + 2 x kv heads, d]
            q, k, v = heads[:, :, :hq], heads[:, :, hq:hq + hk], heads[:, :, hq + hk:]
        else:
            q, k, v = (self._rows(getattr(attn, name), x).view(*lead, -1, d) for name in QKV)
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head before rotary
            q, k = attn.q_norm(q), attn.k_norm(k)
        elif self.kernels.stack:
            qk = rotate(heads[:, :, :hq + hk].transpose(1, 2), cos, sin)
            return qk[:, :hq], qk[:, hq:], v.transpose(1, 2)
        return rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin), v.transpose(1, 2)

    def _one_query_each(self, q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, scale: float,
                        sees_reserved: torch.Tensor, slots: torch.Tensor, offset: int,
                        order: DecodeOrder | None = None, where: tuple[int, int] = (0, 0)) -> torch.Tensor:
        """Batch-invariant attention, [1, rows, heads * d]: each row computed as the one-token decode at its
        position computes it, so a row's result does not depend on the rows beside it; rows that do not see
        reserved entries attend over the cache after them, as if there were none. Where SDPA is slow for one
        query (`one_query_by_matmul`): `attention.exact_attention`, every row over its keys in the order that
        decode reads them (a tree node's ancestors included), so a tree's rows are exact too. Elsewhere rows are
        the batch of one SDPA call over the common span (`_kv_span`), exact for a chain only."""
        rows, r = q.shape[2], offset
        if one_query_by_matmul(q):
            if order is None or self.float_kv is None:  # no order from the forward: a copy of its own
                order = order or decode_orders(mask[None, None], sees_reserved[None], slots[None], offset)[0]
                keys, values = kv[0, :, :order.end].float(), kv[1, :, :order.end].float()
            else:
                keys, values = self.float_kv.layer(*where, kv, order.filled)
            return exact_attention(q, keys, values, order, scale, self.rows_agree).transpose(1, 2).reshape(1, rows, -1)
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

    def _kv_span(self, end: int) -> int:
        """Cache slots a masked forward attends over when its rows end at slot `end`.

        Batch-invariant: one 16-slot block past the block holding `end`. On this CPU's bf16 attention kernel
        (PyTorch's flash kernel) a row's output changes when the attended span ends inside the 16-slot block of
        the row's last visible slot and is the same for every span past it (measured over 88 prefix lengths),
        so a one-row decode and a verify row at the same position then agree bit for bit."""
        return -(-end // 16) * 16 + 16 if self.invariant else end

    def _rows(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """fn (a row-wise module: projection, MLP, head) over x [1, rows, H]. Batch-invariant: in one call where
        every row count from 2 keeps each row's result (`one_call`, probed), a single row padded to two in the
        projections whose one-row kernel rounds otherwise (packed kernels: `RowKernels.pad_one_row`, probed per
        weight shape; else every module); elsewhere in pieces of exactly ROW_BLOCK rows, the last one padded
        with zero rows, so that every GEMM of every forward, a one-token decode's included, has the same shape,
        kernel and reduction order per row."""
        fn = self.kernels(fn)
        if not self.invariant or self._prefilling or (
                self.one_call and (self.kernels.pad_one_row is not None or x.shape[:-1].numel() > 1)):
            return fn(x)  # every row count but one keeps each row's result (`_one_call_keeps_rows`)
        lead, x = x.shape[:-1], x.reshape(1, -1, x.shape[-1])  # a batch's rows [B, R, H] as one run of B*R rows
        rows = x.shape[-2]
        if self.one_call:  # one row, and kernels that do not pad it themselves
            return fn(zero_rows(x, 2))[..., :1, :].reshape(*lead, -1)
        if rows % ROW_BLOCK:
            x = zero_rows(x, rows + -rows % ROW_BLOCK)
        out = torch.cat([fn(piece) for piece in x.split(ROW_BLOCK, dim=-2)], dim=-2)[..., :rows, :]
        return out.reshape(*lead, -1)

    def _probed(self, probe: str, measure: Callable[[], T]) -> T:
        """`measure()` once per model, dtype, kernels and device (the kernels a build and a CPU pick may differ)."""
        held = _PROBED.setdefault(self.model, {})
        key = (probe, self._dtype, self.kernels.packed, self.kernels.stack, str(self._layer_devices[0]))
        if key not in held:
            held[key] = measure()
        return held[key]

    def _stacks_agree(self) -> bool:
        """Whether the stacked q/k/v and gate/up calls (`kernels.Stacked`) give every part bit for bit what its own
        call gives, for the first layer on random rows of several counts and scales (the MLP whole, its activation
        reading the stacked output's halves); where not, each linear is called on its own."""
        layer = self.model.model.layers[0]
        generator = torch.Generator().manual_seed(2)
        kernels = self.kernels
        attn, width = layer.self_attn, self.model.config.hidden_size
        for rows in (1, 2, 3, 9, 17, 64):
            scales = torch.logspace(-1, 1.5, rows)[:, None]
            x = (torch.randn(1, rows, width, generator=generator) * scales).to(self._dtype).to(self._layer_devices[0])
            with torch.inference_mode():
                qkv, mlp = stacked(attn, QKV), layer.mlp
                apart = [kernels.linear(getattr(attn, name), x) for name in QKV]
                if not all(map(torch.equal, kernels.linear(qkv, x).split(qkv.sizes, dim=-1), apart)):
                    return False
                if not torch.equal(kernels.gated_mlp(mlp, x, stack=True), kernels.gated_mlp(mlp, x, stack=False)):
                    return False
        return True

    def _one_call_keeps_rows(self) -> bool:
        """Whether one call over any number of rows from 2 up gives each row what ROW_BLOCK-row pieces give it,
        for the first layer's projections and MLP and the head, on random rows (so `_rows` pads a decode to 2 rows
        and runs a verify's rows in one call). Measured with oneDNN's packed bf16 linears on a 2-core EPYC
        (2026-11-26): row counts 2..130 keep every row, random and wide-range inputs alike; one row does not
        (down_proj's one-row kernel rounds some outputs otherwise). Probed here because the kernels a build and
        a CPU pick may differ; where any count differs, `_rows` keeps the ROW_BLOCK pieces."""
        layer = self.model.model.layers[0]
        generator = torch.Generator().manual_seed(0)
        width = self.model.config.hidden_size
        stacks = [stacked(layer.self_attn, QKV)] if self.kernels.stack else []
        for module in (layer.self_attn.q_proj, *stacks, layer.mlp, self.model.get_output_embeddings()):
            fn = self.kernels(module)
            x = torch.randn(1, 72, width, generator=generator).to(self._dtype).to(self._layer_devices[0])
            with torch.inference_mode():
                pieces = torch.cat([fn(p) for p in x.split(ROW_BLOCK, dim=-2)], dim=-2)
                if not all(torch.equal(fn(x[:, :rows]), pieces[:, :rows]) for rows in (2, 3, 9, 17, 33, 72)):
                    return False
        return True

    def _one_row_differs(self) -> frozenset[tuple[int, int]]:
        """The weight shapes (out, in) of the first layer's projections and the head whose packed one-row kernel
        gives some row other than a call over many rows gives it (64 random rows, 16 for the head, over a range
        of scales). On a 2-core EPYC's oneDNN (2026-11-26): only down_proj's, 576 x 1536 (about 1 row in 12)."""
        layer = self.model.model.layers[0]
        generator = torch.Generator().manual_seed(1)
        linears: list[torch.nn.Linear | Stacked] = [m for m in layer.modules() if isinstance(m, torch.nn.Linear)]
        if self.kernels.stack:  # the calls a forward makes: q/k/v and gate/up stacked
            linears += [stacked(layer.self_attn, QKV), stacked(layer.mlp, GATE_UP)]
        linears.append(self.model.get_output_embeddings())
        differs = set()
        for module in linears:
            count = 16 if module is linears[-1] else 64
            scales = torch.logspace(-1, 1.5, count)[:, None]
            x = (torch.randn(1, count, module.in_features, generator=generator) * scales).to(self._dtype)
            x = x.to(module.device if isinstance(module, Stacked) else module.weight.device)
            with torch.inference_mode():
                many = self.kernels.linear(module, x)
                if not all(torch.equal(self.kernels.linear(module, x[:, r:r + 1]), many[:, r:r + 1]) for r in range(count)):
                    differs.add(shape(module))
        return frozenset(differs)

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.model.get_output_embeddings()
        return self._rows(head, hidden.to(head.weight.device))

    # ------------------------------------------------------------------------------------ compiled path
    def bucket(self, rows: int) -> int:
        fits = [b for b in self.buckets if b >= rows]
        return fits[0] if fits else rows  # larger than every bucket: its own size (compiled once, on first use)

    def _run_compiled(self, work: list[Rows]) -> list[Out]:
        """`run` as one graph over every slot: [slots, bucket] rows (idle slots and padding rows: zero inputs
        that see only themselves); the host writes each busy sequence's rows into the cache afterwards."""
        size, rows = len(self.slots), self.bucket(max(len(x) for x in work))
        block, sees = _padded(work, size, rows, 0)
        embeds = torch.zeros(size, rows, work[0].embeds.shape[-1], dtype=self._dtype, device=self.device)
        positions = torch.zeros(size, rows, dtype=torch.long, device=self.device)
        base = torch.zeros(size, dtype=torch.long)
        for x in work:
            b, m = x.target.slot, len(x)
            embeds[b, :m], positions[b, :m] = x.embeds, x.positions
            base[b] = x.target.offset + x.target.length
        if self._compiled is None:
            self._compiled = self.compiled(self._step)
        self.note_bucket(rows)
        device = self.device
        logits, hidden, captured, written = self._compiled(embeds, positions, block.to(device), sees.to(device),
                                                           base.to(device))
        out = []
        for x in work:  # CUDA-graph outputs are overwritten by the next replay: keep copies of what outlives it
            t, m = x.target, len(x)
            self._write(written, t.slot, int(base[t.slot]))
            t.captured = {i: c[t.slot, :m].clone() for i, c in zip(self._capture, captured)}
            out.append(Out(logits[t.slot, x.heads].clone(), hidden[t.slot, :m].clone()))
        return out

    def _step(self, embeds: torch.Tensor, positions: torch.Tensor, block: torch.Tensor, sees_reserved: torch.Tensor,
              base: torch.Tensor):
        """The compiled forward over [slots, bucket] rows: logits, hidden states, captured layers, the rows' keys
        and values (written by the host)."""
        offset = self.slots[0].offset
        mask = self.visibility(torch.zeros_like(block), sees_reserved, base, self.kv.capacity, offset)  # the prefixes
        slots = base[:, None] + torch.arange(block.shape[1], device=block.device)
        apart = RowsApart(block, [])
        hidden, captured = self.decoder(embeds, positions, mask, slots, sees_reserved, self.kv.layer, apart=apart,
                                        offset=offset)
        return self._head(hidden), hidden, captured, torch.stack(apart.written)

    def _write(self, written: torch.Tensor, slot: int, base: int) -> None:
        """Slot `slot`'s keys and values of a compiled forward ([layers, 2, slots, kv heads, R, d]) into its cache at
        positions base.. (one copy per device's buffer)."""
        rows = written.shape[-2]
        for g, buf in enumerate(self.kv.buffers):
            layers = [i for i, (group, _) in enumerate(self.kv.where) if group == g]
            buf[:, :, slot, :, base:base + rows] = written[layers, :, slot].to(buf.device)

    def compiled(self, fn: Callable) -> Callable:
        """`fn` under torch.compile with this target's mode and backend, static shapes, one graph per bucket."""
        # One graph per bucket and capture set; every target model of a process shares `_step`'s code object,
        # whose recompile limit dynamo counts (a test session builds dozens): never hit it.
        limit = 1024
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), limit))
        return torch.compile(fn, mode=self._mode(), backend=self._backend(), fullgraph=True, dynamic=False)

    def note_bucket(self, size: int) -> None:
        """A compiled forward of `size` rows is about to run: one that compiles inside a round is recorded."""
        if size not in self.compile_seconds and not self._warming:
            self.late_compiles.append(size)
            self.compile_seconds[size] = float("nan")

    def _mode(self) -> str | None:
        return "reduce-overhead" if self.compile_mode == "reduce-overhead" else None

    def _backend(self) -> str:
        return "inductor" if self.compile_mode in ("reduce-overhead", "inductor", "default") else self.compile_mode

    def warm_up(self, sizes: tuple[int, ...] | None = None) -> dict[int, float]:
        """Compile every bucket for every slot now (on throwaway one-token prompts, inside the planned cache), so
        no timed forward pays for it; seconds per bucket."""
        if self.compile_mode is None:
            return {}

        def run(size: int) -> None:
            for t in self.slots:
                t.prefill([0], room=0)
            self.verify([(t, 0, DraftTree.chain([0] * (size - 1)), None) for t in self.slots])

        seconds = self.warm_buckets(sizes or self.buckets, run)
        for t in self.slots:
            t.length = 0
        return seconds

    def warm_buckets(self, sizes: tuple[int, ...], run: Callable[[int], None]) -> dict[int, float]:
        """Compile each bucket by calling run(size) three times (CUDA graph trees run eagerly once, record on the
        second call, replay after); seconds per bucket, kept in `compile_seconds`."""
        self._warming = True
        try:
            for size in sizes:
                t0 = time.perf_counter()
                for _ in range(3):
                    run(size)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                self.compile_seconds[size] = time.perf_counter() - t0
        finally:
            self._warming = False
        return dict(self.compile_seconds)

    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """The sequence in slot `src` moves to the free slot `dst` (its cache entries and its `Target`)."""
        t = self.slots[src]
        self.kv.copy_slot(src, dst, t.offset + t.length)
        if self.float_kv is not None:
            self.float_kv.forget(src)
            self.float_kv.forget(dst)
        self.slots[src], self.slots[dst] = self.slots[dst], t
        self.slots[src].slot, t.slot = src, dst


def _padded(work: list[Rows], size: int, rows: int, first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequences' blocks and reserved-entry flags laid out [size, rows(, rows)], each at its slot - `first`;
    padding rows and other indices see only themselves."""
    block = torch.eye(rows, dtype=torch.bool).repeat(size, 1, 1)
    sees = torch.zeros(size, rows, dtype=torch.bool)
    for x in work:
        b, m = x.target.slot - first, len(x)
        block[b, :m, :m] = x.block
        sees[b, :m] = x.sees_reserved
    return block, sees


def _one_offset(work: list[Rows]) -> int:
    offsets = {x.target.offset for x in work}
    assert len(offsets) == 1, "sequences of one forward have the same reserved entries"
    return offsets.pop()


class Target:
    """One sequence's view of the target: its slot of the cache, what is committed there, and what its last
    forward left (captured layers, side rows' hidden states). Methods see it as `DecodeState.target`.

    Alone (`Target(model, device, ...)`) it is the one slot of a target model of its own; `TargetModel(...,
    slots=B)` makes B of them over one cache (`shared`)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, compile: str | None = None,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS, invariant: bool = False, packed: bool | None = None,
                 *, shared: TargetModel | None = None) -> None:
        self.shared = shared or TargetModel(model, device, compile, buckets, invariant, slots=0, packed=packed)
        self.slot = self.shared.join(self)
        self.length = 0  # tokens whose KV is committed
        self.forwards = 0  # forward passes so far (rounds record how many they used)
        self.captured: dict[int, torch.Tensor] = {}  # layer index -> [T, H] output of the last forward
        self.reserved: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.side_hidden: torch.Tensor | None = None  # final hidden states of the last verify's side rows
        self.last_path: list[int] = []  # the accepted path of the last commit (node indices, root first)
        self._root_cached = False  # the verify being committed had its root in the cache already

    # what every sequence of one target model shares
    model = property(lambda self: self.shared.model)
    device = property(lambda self: self.shared.device)
    invariant = property(lambda self: self.shared.invariant)
    kv = property(lambda self: self.shared.kv)
    num_layers = property(lambda self: self.shared.num_layers)
    buckets = property(lambda self: self.shared.buckets)
    compile_seconds = property(lambda self: self.shared.compile_seconds)
    late_compiles = property(lambda self: self.shared.late_compiles)

    def plan(self, tokens: int) -> None:
        self.shared.plan(tokens)

    def warm_up(self, sizes: tuple[int, ...] | None = None) -> dict[int, float]:
        return self.shared.warm_up(sizes)

    # ------------------------------------------------------------------------------------ features
    def capture(self, layers: list[int]) -> None:
        """Keep the outputs of these decoder layers (0-based) after every forward (idempotent)."""
        for i in layers:
            if not 0 <= i < self.num_layers:
                raise UsageError(f"a drafter reads target layer {i}, but the target has {self.num_layers} layers "
                                 f"(0-{self.num_layers - 1})")
        self.shared._capture = tuple(sorted({*self.shared._capture, *layers}))

    def reserve(self, kv: list[tuple[torch.Tensor, torch.Tensor]] | None) -> None:
        """Key/value entries ([kv heads, S, d] per layer) kept at the front of the cache from the next prefill
        on and seen only by side rows; the target's own tokens never see them."""
        self.reserved = kv

    @property
    def offset(self) -> int:
        return self.reserved[0][0].shape[1] if self.reserved else 0

    # ------------------------------------------------------------------------------------ forwards
    @torch.inference_mode()
    def prefill(self, ids: list[int], room: int = 2048) -> torch.Tensor:
        """Run the prompt through an emptied cache (sized for `room` more tokens); returns the next token's logits [V]."""
        self._root_cached = False
        r, n = self.offset, len(ids)
        self.shared.grow(r + n + room, keep=r)
        for i, (k, v) in enumerate(self.reserved or []):
            layer = self.kv.layer(i)[:, self.slot]
            layer[0, :, :r] = k.to(layer)
            layer[1, :, :r] = v.to(layer)
        self.length = 0
        if self.shared.float_kv is not None:
            self.shared.float_kv.forget(self.slot)
        rows = Rows(self, self._embed(ids), torch.arange(n, device=self.device), None,
                    torch.zeros(n, dtype=torch.bool), slice(n - 1, n))
        logits = self.shared.run([rows])[0].logits[0]
        self.length = n
        return logits

    @torch.inference_mode()
    def verify(self, root: int, tree: DraftTree, extras: VerifyExtras | None = None) -> torch.Tensor:
        """Logits [N+1, V] for the root (the last committed token) and every draft node.

        Each node sees the cached prefix, itself and its ancestors, at position prefix + depth. The root is
        fed first unless `extras.root_logits` says it is cached already."""
        return self.shared.verify([(self, root, tree, extras)])[0]

    def verify_rows(self, root: int, tree: DraftTree, extras: VerifyExtras | None = None) -> Rows:
        """The rows a verify of `tree` runs: root and nodes (ancestor mask, positions prefix + depth), then any
        side rows; only the drafts when the root is cached already (`extras.root_logits`)."""
        extras = extras or VerifyExtras()
        if extras.root_logits is not None:
            if not tree.is_chain:
                raise ValueError("a root cached by forward() can only be followed by a chain")
            return self._append_rows(tree.tokens)
        ids = [root, *tree.tokens]
        n, side = len(ids), extras.side
        m = 0 if side is None else len(side)
        block = torch.zeros(n + m, n + m, dtype=torch.bool)
        block[:n, :n] = tree.ancestor_mask()
        positions = torch.tensor(tree.depths())
        sees_reserved = torch.zeros(n + m, dtype=torch.bool)
        embeds = self._embed(ids)
        if side is not None:
            block[n:, :n] = side.attend
            block[n:, n:] = torch.eye(m, dtype=torch.bool)
            positions = torch.cat((positions, side.positions.cpu()))
            sees_reserved[n:] = True
            embeds = torch.cat((embeds, side.embeds.to(embeds)))
        return Rows(self, embeds, positions.to(self.device) + self.length, block, sees_reserved, slice(0, n))

    def verified(self, rows: Rows, out: Out, extras: VerifyExtras | None) -> torch.Tensor:
        """A verify's logits (root first) from its forward's output; side rows' hidden states kept."""
        if extras is not None and extras.root_logits is not None:
            self._root_cached = True  # the drafts' rows follow the cached root: commit() counts it
            self.side_hidden = None
            return torch.cat((extras.root_logits[None], out.logits)) if len(rows) else extras.root_logits[None]
        self.side_hidden = out.hidden[rows.heads.stop:] if len(rows) > rows.heads.stop else None
        return out.logits

    @torch.inference_mode()
    def verify_path(self, root: int, tree: DraftTree, path: list[int]) -> tuple[DraftTree, torch.Tensor]:
        """The tree's path `path` (node indices, root first) verified again as a chain (`TargetModel.verify_paths`)."""
        return self.shared.verify_paths([(self, root, tree, path)])[0]

    @torch.inference_mode()
    def forward(self, tokens: list[int]) -> torch.Tensor:
        """Append `tokens` to the cache in one causal forward; returns their logits [n, V]."""
        logits = self.shared.run([self._append_rows(tokens)])[0].logits
        self.length += len(tokens)
        return logits

    def _append_rows(self, tokens: list[int]) -> Rows:
        n = len(tokens)
        return Rows(self, self._embed(tokens), torch.arange(self.length, self.length + n, device=self.device),
                    torch.ones(n, n, dtype=torch.bool).tril(), torch.zeros(n, dtype=torch.bool), slice(0, n))

    def _embed(self, ids: list[int]) -> torch.Tensor:
        return self.model.get_input_embeddings()(torch.tensor(ids, dtype=torch.long, device=self.device))

    @torch.inference_mode()
    def commit(self, path: list[int]) -> None:
        """Keep the cache entries of the accepted path (node indices, root first) and drop the rest.

        A prefix of the node order is already in place; otherwise the accepted entries move down."""
        start = self.offset + self.length - (1 if self._root_cached else 0)  # cache slot of the root
        self._root_cached = False
        if path != list(range(len(path))):
            self.kv.move(torch.tensor(path, device=self.device) + start,
                         torch.arange(start, start + len(path), device=self.device), self.slot)
        self.captured = {i: h[path] for i, h in self.captured.items()}
        self.last_path = path
        self.length = start + len(path) - self.offset


def unpack(x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Packed rows [1, heads, T, d] laid out as [B, heads, R, d], the rows `real` [B, R] marks filled in order."""
    full = x.new_zeros(*real.shape, x.shape[1], x.shape[3])
    full[real] = x[0].transpose(0, 1)
    return full.transpose(1, 2)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (the rotate-half convention of Llama/Qwen checkpoints); cos/sin are [1, T, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]
