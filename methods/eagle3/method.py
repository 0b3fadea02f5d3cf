"""The EAGLE-3 proposer: keeps the draft's cache in step with the committed tokens and grows a tree per round."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specbench_methods.checkpoints import Checkpoint
from specbench_methods.eagle3.network import Eagle3Draft
from specbench_methods.eagle3.tree_search import beam_search, top_nodes
from specbench_methods.features import FeatureDrafter
from specbench_methods.layers import Apart, DraftKV, Slots, causal_mask, round_slots
from specbench_cli.core.host_copy import to_device
from specbench_cli.core.method import DecodeState
from specbench_cli.core.tree import DraftTree


class Eagle3(FeatureDrafter):
    """Subclasses change EAGLE-3 through hooks: `extra_tensors` (checkpoint tensors they read themselves),
    `shared_kv` (keys/values every draft query of a round also sees) and `backlog_kv` (how catch-up fills
    the cache)."""

    name = "eagle3"
    drafter_names = ("eagle3",)
    extra_tensors: tuple[str, ...] = ()  # checkpoint tensors a subclass reads itself (ConFu's "confu.*")
    inherent_syncs = "one per round: the accepted length, read with the tree (its top nodes chosen on the device)"

    @dataclass
    class Options:
        # WhiFlash seed Table 7 (EAGLE-3 settings): tree depth 8, top-k 10, 60 tree tokens. total_token
        # counts the root as in SafeAILab's `total_token` (59 drafted nodes). The HVD seed's setting is
        # total_token=32 depth=8 top_k=4 (the EAGLE Qwen3 evaluation script).
        depth: int = 8
        top_k: int = 10
        total_token: int = 60
        # --opt ranges, checked before any model loads: (low, high), None = unbounded.
        RANGES = {"depth": (0, 64), "top_k": (1, 256), "total_token": (2, 1024)}

    @dataclass
    class Lane(FeatureDrafter.Lane):
        kv: DraftKV = field(default_factory=DraftKV)  # draft KV of positions fed by target features
        last_features: torch.Tensor | None = None  # the newest committed position's features

    def __init__(self, options: Options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        self.checkpoint = Checkpoint.read(self.drafter_ref(self.name), self.name)
        self.draft = Eagle3Draft.load(self.checkpoint, model.model, extra_tensors=self.extra_tensors)
        self.capture = self.draft.config.capture

    def shared_kv(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Keys/values [kv heads, 1, d] every draft query of this round sees besides the cache and its own
        ancestors (ConFu's future token); EAGLE-3 has none."""
        return None

    def backlog_kv(self, states: list[DecodeState], feats: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor):
        """The draft cache entries of the committed positions nothing reads outputs of, for the sequences
        `states` (their rows one after another): keys/values only (fc, norms, k/v projections), never attention,
        MLP or head (WhiFlash §3.3's KV-only prefill), so every sequence's backlog goes through one call."""
        return self.draft.keys_values(feats, ids, positions)

    @torch.inference_mode()
    def catch_up(self, states: list[DecodeState]) -> None:
        """Cache every committed position but the newest through `backlog_kv`, for each sequence (one call for
        all). A routed method calls this for the backlog after an idle stretch; `propose` calls it every round,
        so a plain EAGLE-3 run and a routed one build the same cache the same way."""
        backlogs = [(s, rows) for s in states if (rows := self._backlog(s)) is not None]
        if not backlogs:
            return
        k, v = self.backlog_kv([s for s, _ in backlogs], *(torch.cat([rows[j] for _, rows in backlogs]) for j in range(3)))
        sizes = [rows[1].shape[0] for _, rows in backlogs]
        for (s, _), keys, values in zip(backlogs, k.split(sizes, 1), v.split(sizes, 1)):
            self.lane(s).kv.append(keys, values)

    def _backlog(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The committed positions not in the draft cache but the newest, as (features, tokens, positions), or
        None; the newest stays pending (`propose` runs the whole layer on it)."""
        start = self.absorbed(state)
        feats = self.take_pending(state, start)
        n, device = feats.shape[0], feats.device
        self.lane(state).pending = [feats[-1:]]
        if n <= 1:
            return None
        ids = to_device(state.tokens[start + 1: start + n], device)
        return feats[:-1], ids, torch.arange(start, start + n - 1, device=device)

    # ------------------------------------------------------------------------------------ what profiling times
    @torch.inference_mode()
    def switching_probes(self, target, length: int, backlogs: list[int], generator: torch.Generator,
                         draft_only: bool = False) -> tuple[Callable[[], None], dict[int, Callable[[], None]]]:
        """What `profile --switching` times at base length `length` (WhiFlash Table 4/12), over random ids and
        features: one round (the draft over a `length`-row cache, then the target's verify of its tree; the
        target's cache holds `length` tokens; `draft_only`: the draft alone) and, per backlog B, a switch's
        catch-up (KV-only rows for B-1 tokens, the full layer on the newest, over length + B - 1 cached rows)."""
        draft, c, device = self.draft, self.draft.config, target.device
        most, L = max(backlogs), length
        ids = torch.randint(0, c.vocab, (L,), generator=generator).tolist()
        target.prefill(ids)
        feats = torch.randn(L + most, 3 * c.target_hidden, generator=generator).to(device, draft.fc.weight.dtype)
        tok = torch.randint(0, c.vocab, (L + most + 1,), generator=generator).to(device)
        before = DraftKV().fixed(self.capacity)
        before.append(*draft.keys_values(feats[:L - 1], tok[1:L], torch.arange(L - 1, device=device)))
        full = draft.keys_values(feats[:L], tok[1:L + 1], torch.arange(L, device=device))
        state = DecodeState(ids + [int(tok[L])], L, target, 0.0, None)

        def draft_round() -> DraftTree:
            lane = self.lane(state)  # a fixed state; propose() adds the newest row itself
            before.length = L - 1
            lane.kv, lane.pending = before, [feats[L - 1:L]]
            return self.propose([state])[0]

        tree = draft_round()

        def one_round() -> None:
            draft_round()
            target.verify(state.tokens[-1], tree)  # verify writes past the committed length: nothing to undo

        def catch_up(B: int) -> None:
            pos = torch.arange(L, L + B, device=device)
            kv = full
            if B > 1:  # KV-only rows, then the full layer on the newest
                k, v = draft.keys_values(feats[L:L + B - 1], tok[L + 1:L + B], pos[:-1])
                kv = (torch.cat((full[0], k), 1), torch.cat((full[1], v), 1))
            draft.step(feats[L + B - 1:L + B], tok[L + B:L + B + 1], pos[-1:], kv, causal_mask(1, L + B - 1, device))

        return draft_round if draft_only else one_round, {B: functools.partial(catch_up, B) for B in backlogs}

    def switching_room(self) -> int:
        """Positions a round adds past the base length (its tree), which `profile --switching` keeps free."""
        return self.options.total_token

    def kv_only_probe(self, rows: int) -> Callable[[], None]:
        """What calibration times per backlog size: the KV-only prefill of `rows` random rows (a lazy catch-up)."""
        draft, c = self.draft, self.draft.config
        device = next(draft.parameters()).device
        feats = torch.randn(rows, 3 * c.target_hidden, device=device, dtype=draft.fc.weight.dtype)
        ids = torch.randint(0, c.vocab, (rows,), device=device)
        pos = torch.arange(rows, device=device)
        return torch.inference_mode()(lambda: draft.keys_values(feats, ids, pos))

    def absorbed(self, state: DecodeState) -> int:
        """Committed positions of the sequence already in its draft cache."""
        return self.lane(state).kv.length

    # ------------------------------------------------------------------------------------ drafting
    @torch.inference_mode()
    def propose(self, states: list[DecodeState]) -> list[DraftTree]:
        """Trees for a batch of sequences, every draft step one forward for all of them: the backlogs' keys and
        values (`catch_up`), the newest positions (each over its own cache), then each tree level (EAGLE's beam,
        `beam_search`), each sequence's tree its own top nodes. Every step writes its keys into one round buffer
        (`round_slots`: a lone sequence's own cache, with room for the round) laid out as [cache | shared keys |
        newest | level 1 | level 2 ...] and attends over it in place."""
        o, draft, batch = self.options, self.draft, len(states)
        lanes = [self.lane(s) for s in states]
        shared_kv = [self.shared_kv(s) for s in states]
        self.catch_up(states)
        starts = [self.absorbed(s) for s in states]
        feats = torch.cat([self.take_pending(s, a) for s, a in zip(states, starts)])  # [B, 3Ht], the newest
        device = feats.device
        levels = min(o.depth, o.total_token - 2)  # the beam's expansions (see below)
        # `shared_kv`: seen by every query of the round, right after the cache (which sequences have one: `has`)
        shared, has = _stacked(shared_kv)
        width = 0 if shared is None else shared[0].shape[-2]
        like = torch.empty(draft.config.kv_heads, 0, draft.config.head_dim, device=device, dtype=feats.dtype)
        slots, real = round_slots([lane.kv for lane in lanes], width + 1 + levels * o.top_k, like)
        cached = slots.start
        if shared is not None:
            slots.k[..., cached:cached + width, :], slots.v[..., cached:cached + width, :] = shared
        one = torch.ones(batch, 1, dtype=torch.bool, device=device)
        shared_seen = [] if has is None else [to_device(has, device)[:, None]]
        seen = torch.cat((real, *shared_seen, one), 1)  # cache, shared, newest
        ids = to_device([[s.tokens[a + 1]] for s, a in zip(states, starts)], device)
        out, newest = self._step(feats[:, None], ids, to_device(starts, device)[:, None],
                                 Slots(slots.k, slots.v, cached + width), seen[:, None])
        last = out[:, -1]
        with states[0].timed("draft_head"):
            first = self.run_step("head", draft.log_probs, last)
        length = to_device([s.target.length for s in states], device)[:, None]
        eye = torch.eye(o.top_k, dtype=torch.bool, device=device).expand(batch, -1, -1)
        hidden, ancestry = last[:, None].expand(-1, o.top_k, -1), eye
        seen = seen[:, None].expand(-1, o.top_k, -1)
        base = cached + width + 1

        def expand(tokens, rows, level):
            nonlocal hidden, ancestry
            if level > 0:
                hidden = hidden.gather(1, rows[..., None].expand(-1, -1, hidden.shape[-1]))
                ancestry = torch.cat((ancestry.gather(1, rows[..., None].expand(-1, -1, ancestry.shape[-1])), eye), 2)
            out, _ = self._step(hidden, draft.to_target(tokens), (length + level).expand(-1, o.top_k),
                                Slots(slots.k, slots.v, base + level * o.top_k), torch.cat((seen, ancestry), 2),
                                features=False)
            hidden = out
            with states[0].timed("draft_head"):
                return self.run_step("head", draft.log_probs, out)

        # A node of level l (1 = the root's children) is kept only with its l - 1 ancestors (a child never outscores
        # its parent: log-probs add up), so no level past total_token - 1 holds a kept node; the beam stops there. The
        # same trees as all `depth` levels (SafeAILab's topK_genrate runs them whatever total_token keeps), without
        # the draft steps that cannot change them: a chain of 2 at depth 3 drafts 2 steps, not 4.
        cands = beam_search(first, expand, o.top_k, levels)
        for b, lane in enumerate(lanes):  # the newest position joins each cache once the round's scratch is read
            lane.kv.append(newest[0][b], newest[1][b])
            lane.last_features = feats[b]
        kept, parents = top_nodes(cands, o.total_token - 1)  # left on the device: accept reads the trees
        tokens = draft.to_target(cands.tokens.gather(-1, kept))
        return [DraftTree(tokens[b], parents[b]) for b in range(batch)]

    def _step(self, h: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, slots: Slots, mask: torch.Tensor,
              features: bool = True) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One draft step over a round's buffers: eager, it writes its keys into `slots` and attends in place;
        compiled, one graph reads the whole buffers (`Apart`) and its keys are written after."""
        if self.graphs is None:
            return self.draft.step(h, ids, positions, slots, mask, features=features)
        out, (k, v) = self.graphs("step", self._apart_step, h, ids, positions, slots.k, slots.v,
                                  Apart.mask(mask, slots), features=features)
        slots.write(k, v)
        return out, (k, v)

    # ------------------------------------------------------------------------------------ compiled
    def start(self, state: DecodeState) -> None:
        super().start(state)
        self.lane(state).kv.fixed(self.capacity)  # compiled: one buffer shape for every round (eager: 0, growing)

    def round_room(self) -> int:
        o = self.options
        return 1 + 1 + min(o.depth, o.total_token - 2) * o.top_k  # ConFu's shared key, the newest, the levels

    @torch.inference_mode()
    def warm_steps(self, batch: int) -> None:
        """The newest position's step (target features, one row) and a level's (the draft's outputs, top_k rows), each
        with its head."""
        c, o, weight = self.draft.config, self.options, self.draft.fc.weight
        slots, positions = self.blank_slots(batch), torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        shapes = [(1, 3 * c.target_hidden, True)] + ([(o.top_k, c.hidden, False)] if min(o.depth, o.total_token - 2) else [])
        for rows, width, features in shapes:
            ids = positions.expand(-1, rows)
            out, _ = self._step(weight.new_zeros(batch, rows, width), ids, ids, slots, self.own_keys_only(batch, rows),
                                features)
            self.run_step("head", self.draft.log_probs, out[:, -1] if features else out)


def _stacked(kvs: list[tuple[torch.Tensor, torch.Tensor] | None]) -> tuple[tuple[torch.Tensor, torch.Tensor] | None,
                                                                          torch.Tensor | None]:
    """Per-sequence keys/values [kv heads, T, d] (or None) as [B, kv heads, T, d], zeros where a sequence has none,
    and which sequences have them (bool [B]); (None, None) when none has any."""
    present = [kv for kv in kvs if kv is not None]
    if not present:
        return None, None
    zero = tuple(torch.zeros_like(t) for t in present[0])
    full = [kv if kv is not None else zero for kv in kvs]
    return (torch.stack([kv[0] for kv in full]), torch.stack([kv[1] for kv in full])), \
        torch.tensor([kv is not None for kv in kvs])
