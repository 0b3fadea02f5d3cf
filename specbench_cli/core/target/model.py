"""`TargetModel`, the verifying model over one static cache of `slots` sequences and its one forward, and
`Target`, one sequence of it (they make each other: a target model its slots, a lone sequence its model)."""

from __future__ import annotations

import torch

from specbench_cli.core.errors import UsageError
from specbench_cli.core.host_copy import to_device
from specbench_cli.core.kernels import RowKernels, packs
from specbench_cli.core.target.backends import Backend, Causal, KernelRows
from specbench_cli.core.target.cache import StaticKV
from specbench_cli.core.target.choose import choose
from specbench_cli.core.target.compiled import DEFAULT_BUCKETS, CompiledPath
from specbench_cli.core.target.forward import Decoder
from specbench_cli.core.target.rows import Layout, Out, Rows, VerifyExtras, one_offset, padded, visibility
from specbench_cli.core.tree import DraftTree

# Families whose decoder layers this forward reproduces: pre-norm residual blocks, rotary attention with
# optional per-head q/k RMSNorm (Qwen3) and biases (Qwen2), full attention in every layer.
SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")
ROOM = 256  # cache slots kept free past prompt + max-new-tokens for the largest verify (grown if a tree needs more)


def check_supported(model: torch.nn.Module) -> None:
    kind = getattr(model.config, "model_type", "?")
    layers = model.model.layers if kind in SUPPORTED else []
    windowed = [i for i, block in enumerate(layers) if getattr(block.self_attn, "sliding_window", None)]
    if kind not in SUPPORTED or windowed:
        why = f"sliding-window layers {windowed[:3]}" if windowed else f"model type '{kind}'"
        raise UsageError(f"the target's {why} is not supported by specbench's engine (it runs {', '.join(SUPPORTED)} "
                         "models with full attention)")


class TargetModel:
    """The verifying model over one static cache of `slots` sequences, and its one forward, `run`.

    Each sequence is a `Target` (its slot of the cache, its committed length, its captured features); a single
    sequence is a one-slot target model (`Target(model, device)` makes one). `run` takes the rows of any
    sequences in consecutive slots — a prefill, a verify with or without side rows, an append — through one
    decoder (`forward.Decoder`): the row-wise parts (projections, MLP, head) over the rows alone, packed,
    attention over each sequence's cache with its rows padded to the longest; a prefill with plain causality,
    everything else on the backend `choose` picked (`backend`), eager or compiled (`compiled.CompiledPath`)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, compile: str | None = None,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS, invariant: bool = False, slots: int = 1,
                 packed: bool | None = None) -> None:
        """`packed`: projections, MLPs and head on prepacked CPU weights (`core.kernels`; None: wherever
        `kernels.packs` says they can be). `invariant`: every row computed as a one-row forward computes it."""
        check_supported(model)
        self.model = model
        self.device = device
        self.kv = StaticKV(model, 0)
        self.slots: list[Target] = []
        self._capture: tuple[int, ...] = ()  # decoder layers every forward returns (what the sequences asked for)
        dtype = model.get_input_embeddings().weight.dtype
        self.kernels = RowKernels(packs(device, dtype, compile is not None, invariant) if packed is None else packed)
        self.decoder = Decoder(model, self.kernels)
        self.backend = choose(model, device, self.kernels, self.kv, invariant, compile is not None)
        self.prefill_backend = Backend(Causal(), KernelRows(self.kernels))  # a prompt's rows: see `_prefill`
        self.compile_mode = compile
        self.buckets = tuple(sorted(buckets))
        self.compiled = None if compile is None else CompiledPath(self, compile)
        self._masked = self._run_eager if self.compiled is None else self.compiled.run
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
        """What attends in a masked forward (run.json's `attention`): "row kernel" (`core.row_attention`, every
        row of a masked eager forward; a prefill keeps SDPA), else "pytorch" (`core.attention`, SDPA)."""
        return self.backend.attention.name

    @property
    def layers(self) -> str:
        """How a masked forward runs its decoder layers (run.json's `layers`): "one call" (`core.decoder_layers`),
        else "pytorch" (PyTorch operators, one module at a time)."""
        return "pytorch" if self.backend.layers is None else self.backend.layers.name

    @property
    def rows(self) -> str:
        """How a masked forward runs its projections, MLP and head over its rows (run.json's `rows`, with
        `stacked`: whether q/k/v and gate/up run as one call each). Both follow the start-up probes
        (`probes.one_call_keeps_rows`, `probes.stacks_agree`), which differ between CPUs and torch builds."""
        return self.backend.rows.name

    invariant = property(lambda self: self.backend.invariant, doc="every row computed as a one-row forward computes it")
    exact_trees = property(lambda self: self.backend.exact_trees,
                           doc="a tree's rows come out exact too (else greedy decoding verifies its path again)")
    compile_seconds = property(lambda self: self.compiled.compile_seconds if self.compiled else {})
    late_compiles = property(lambda self: self.compiled.late_compiles if self.compiled else [])

    @property
    def num_layers(self) -> int:
        return len(self.model.model.layers)

    def plan(self, tokens: int) -> None:
        """Size the cache for sequences of up to `tokens` positions before anything is timed (a compiled run
        does this before warming up, so no timed forward meets a reallocation and its recompile)."""
        self.grow(self.slots[0].offset + tokens, keep=0)

    def grow(self, tokens: int, keep: int) -> None:
        """Room for `tokens` cache entries plus a full verify's rows, keeping the first `keep` (every entry when
        the cache has several slots); a compiled target that has to grow recompiles (`CompiledPath.cache_grew`)."""
        if self.kv.ensure(tokens + max(self.buckets[-1], ROOM) + ROOM, keep=keep) and self.compiled is not None:
            self.compiled.cache_grew(self.kv.capacity)

    def warm_up(self, sizes: tuple[int, ...] | None = None) -> dict[int, float]:
        """Compile every bucket now (`CompiledPath.warm_up`); seconds per bucket ({} eager)."""
        return {} if self.compiled is None else self.compiled.warm_up(sizes)

    def forget(self, slot: int) -> None:
        """Slot `slot`'s cache starts over: what the attention keeps beside it goes too."""
        self.backend.attention.forget(slot)

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
        return self._masked(work)

    @torch.inference_mode()
    def verify(self, work: list[tuple[Target, int, DraftTree, VerifyExtras | None]]) -> list[torch.Tensor]:
        """(sequence, root, tree, extras) -> logits [1 + nodes, V] per sequence, in one forward (`Target.verify`)."""
        rows = [t.verify_rows(root, tree, extras) for t, root, tree, extras in work]
        return [t.verified(x, out, extras) for (t, _, _, extras), x, out in zip(work, rows, self.run(rows))]

    @torch.inference_mode()
    def verify_paths(self, work: list[tuple[Target, int, DraftTree, list[int]]]) -> list[tuple[DraftTree, torch.Tensor]]:
        """Each tree's accepted path (node indices, root first) verified again as a chain, in one forward: the
        chains and their logits [len(path), V].

        A batch-invariant target whose attention is not exact for trees (`exact_trees` False: SDPA, each row over
        a common span) computes a chain's rows exactly as one-token decodes, but not a tree's: the kernel's
        result depends on where in the cache a row's visible entries sit, and a tree node's ancestors are not at
        the slots a decode puts them. So greedy decoding of a tree verifies the accepted path again, as a chain.
        Side rows of the tree's verify stay, re-indexed to the chain's nodes (drafters read them; they need not
        be exact)."""
        sides = [t.side_hidden for t, *_ in work]
        chains = [tree.along(path) for _, _, tree, path in work]
        logits = self.verify([(t, root, chain, None) for (t, root, _, _), chain in zip(work, chains)])
        for (t, _, _, path), side in zip(work, sides):
            t.side_hidden = None if side is None else side[path]
        return list(zip(chains, logits))

    def _prefill(self, x: Rows) -> Out:
        """A prompt's rows see only themselves, causally, after any reserved entries: attention spans their own
        slots with plain causality (no [n, n] mask or score matrix for a long prompt, and the same computation
        with or without reserved entries in front). Every target, a batch-invariant one included, runs them on
        `prefill_backend` (every row-wise module in one call): no decode ever recomputes a prompt's rows, so what
        the invariance needs is only that every target prefills alike — and so a plain run's prompt cache and
        first token are bit for bit the batch-invariant replay's (greedy_replay.py), at the cost of one call."""
        t, rows = x.target, len(x)
        base = t.offset + t.length
        f = Layout(None, torch.arange(rows, device=self.device)[None], to_device(x.sees_reserved[None], self.device))
        hidden, captured = self.decoder(self.prefill_backend, x.embeds[None], x.positions[None], f,
                                        lambda i: self.kv.layer(i)[:, t.slot:t.slot + 1, :, base:base + rows],
                                        self._capture)
        return self._outputs([x], self.prefill_backend, [hidden[0]], [[c[0]] for c in captured])[0]

    def _run_eager(self, work: list[Rows]) -> list[Out]:
        first, n = work[0].target.slot, len(work)
        assert [x.target.slot for x in work] == list(range(first, first + n)), "sequences in consecutive slots"
        offset = one_offset(work)
        sizes = [len(x) for x in work]
        rows = max(sizes)
        block, sees = padded(work, n, rows, first)
        base = torch.tensor([x.target.offset + x.target.length for x in work])
        backend = self.backend
        kv_len = backend.span(int(base.max()) + rows)
        device = self.device
        base, block, sees = to_device(base, device), to_device(block, device), to_device(sees, device)
        mask = visibility(block, sees, base, kv_len, offset)
        slots = base[:, None] + torch.arange(rows, device=device)
        # one sequence: its rows as they are; several: packed (row-wise parts on real rows only)
        present = torch.arange(rows)[None] < torch.tensor(sizes)[:, None]  # [n, rows] on the host
        real = None if n == 1 else to_device(present.flatten().nonzero().flatten(), device)
        embeds = torch.cat([x.embeds for x in work])[None]
        positions = torch.cat([x.positions for x in work])[None]
        f = Layout(mask, slots, sees, real, offset, first)
        kv_len = backend.attention.prepare(f, kv_len)
        hidden, captured = self.decoder(backend, embeds, positions, f,
                                        lambda i: self.kv.layer(i)[:, first:first + n, :, :kv_len], self._capture)
        backend.attention.done(work)
        return self._outputs(work, backend, list(hidden[0].split(sizes)), [c[0].split(sizes) for c in captured])

    def _outputs(self, work: list[Rows], backend: Backend, hidden: list[torch.Tensor], captured: list) -> list[Out]:
        """Logits of each sequence's `heads` rows (one head call for all), its captured layers kept on it."""
        heads = [h[x.heads] for x, h in zip(work, hidden)]
        head = self.decoder.head
        logits = ([head(heads[0], backend.rows)] if len(work) == 1
                  else head(torch.cat(heads), backend.rows).split([h.shape[0] for h in heads]))
        for b, x in enumerate(work):
            x.target.captured = {i: c[b] for i, c in zip(self._capture, captured)}
        return [Out(lg, h) for lg, h in zip(logits, hidden)]

    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """The sequence in slot `src` moves to the free slot `dst` (its cache entries and its `Target`)."""
        t = self.slots[src]
        self.kv.copy_slot(src, dst, t.offset + t.length)
        self.forget(src)
        self.forget(dst)
        self.slots[src], self.slots[dst] = self.slots[dst], t
        self.slots[src].slot, t.slot = src, dst


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
        self.shared.forget(self.slot)
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
            return self._append_rows(tree.ids(self.device))
        ids = tree.ids(self.device, root)
        n, side = len(tree) + 1, extras.side
        m = 0 if side is None else len(side)
        mask = tree.mask()  # on the device when the tree's parents are: nothing is read to build the rows
        block = mask.new_zeros(n + m, n + m)
        block[:n, :n] = mask
        positions = tree.positions(mask)
        sees_reserved = torch.zeros(n + m, dtype=torch.bool)
        embeds = self._embed(ids)
        if side is not None:
            block[n:, :n] = side.attend
            block[n:, n:] = torch.eye(m, dtype=torch.bool, device=block.device)
            positions = torch.cat((positions, side.positions.to(positions.device)))
            sees_reserved[n:] = True
            embeds = torch.cat((embeds, side.embeds.to(embeds)))
        return Rows(self, embeds, to_device(positions, self.device) + self.length, block, sees_reserved, slice(0, n))

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

    def _append_rows(self, tokens: list[int] | torch.Tensor) -> Rows:
        n = tokens.numel() if isinstance(tokens, torch.Tensor) else len(tokens)
        return Rows(self, self._embed(tokens), torch.arange(self.length, self.length + n, device=self.device),
                    torch.ones(n, n, dtype=torch.bool).tril(), torch.zeros(n, dtype=torch.bool), slice(0, n))

    def _embed(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor):
            ids = to_device(ids, self.device, torch.long)
        return self.model.get_input_embeddings()(ids)

    @torch.inference_mode()
    def commit(self, path: list[int]) -> None:
        """Keep the cache entries of the accepted path (node indices, root first) and drop the rest.

        A prefix of the node order is already in place; otherwise the accepted entries move down."""
        start = self.offset + self.length - (1 if self._root_cached else 0)  # cache slot of the root
        self._root_cached = False
        if path != list(range(len(path))):
            self.kv.move(to_device(path, self.device) + start,
                         torch.arange(start, start + len(path), device=self.device), self.slot)
        self.captured = {i: h[path] for i, h in self.captured.items()}
        self.last_path = path
        self.length = start + len(path) - self.offset
