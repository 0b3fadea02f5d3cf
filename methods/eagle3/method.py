"""The EAGLE-3 proposer: keeps the draft's cache in step with the committed tokens and grows a tree per round."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from methods.checkpoints import Checkpoint
from methods.eagle3.network import Eagle3Draft
from methods.eagle3.tree_search import Candidates, beam_search, top_nodes
from methods.features import FeatureDrafter
from methods.layers import append_kv, causal_mask, stack_kv
from specbench_cli.core.method import DecodeState
from specbench_cli.core.tree import DraftTree


class Eagle3(FeatureDrafter):
    """Subclasses change EAGLE-3 through hooks: `extra_tensors` (checkpoint tensors they read themselves),
    `shared_kv` (keys/values every draft query of a round also sees) and `backlog_kv` (how catch-up fills
    the cache)."""

    name = "eagle3"
    drafter_names = ("eagle3",)
    extra_tensors: tuple[str, ...] = ()  # checkpoint tensors a subclass reads itself (ConFu's "confu.*")
    inherent_syncs = "two per round: the candidate scores for tree selection, and the accepted length"

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

    def __init__(self, options: Options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        self.checkpoint = Checkpoint.read(self.drafter_ref(self.name), self.name)
        self.draft = Eagle3Draft.load(self.checkpoint, model.model, extra_tensors=self.extra_tensors)
        self.capture = self.draft.config.capture
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = None  # draft KV of positions fed by target features
        self.extra_kv: tuple[torch.Tensor, torch.Tensor] | None = None  # this round's `shared_kv`; not cached

    def shared_kv(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Keys/values every draft query of this round sees besides the cache and its own ancestors (ConFu's
        future token); EAGLE-3 has none."""
        return None

    def backlog_kv(self, feats: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor):
        """The draft cache entries of committed positions nothing reads outputs of: keys/values only (fc,
        norms, k/v projections), never attention, MLP or head (WhiFlash §3.3's KV-only prefill)."""
        return self.draft.keys_values(feats, ids, positions)

    def _visible(self, mask: torch.Tensor, past: int, extra: list) -> tuple[torch.Tensor, tuple | None]:
        """Put `extra_kv` first among the extra keys (after `extra`, whose columns `mask` already has) and
        give it an all-visible column block right after the `past` cached columns."""
        parts = ([self.extra_kv] if self.extra_kv is not None else []) + extra
        if not parts:
            return mask, None
        kv = (torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1))
        if self.extra_kv is None:
            return mask, kv
        ones = torch.ones(mask.shape[0], self.extra_kv[0].shape[1], dtype=torch.bool, device=mask.device)
        return torch.cat((mask[:, :past], ones, mask[:, past:]), 1), kv

    def reset(self, state: DecodeState) -> None:
        self.kv = None

    @torch.inference_mode()
    def catch_up(self, state: DecodeState) -> None:
        """Cache every committed position but the newest through `backlog_kv`. A routed method calls this for
        the backlog after an idle stretch; `advance` calls it every round, so a plain EAGLE-3 run and a
        routed one build the same cache the same way."""
        rows = self._backlog(state)
        if rows is not None:
            self.kv = append_kv(self.kv, self.backlog_kv(*rows))

    def _backlog(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The committed positions not in the draft cache but the newest, as (features, tokens, positions), or
        None; the newest stays pending (`advance` runs the whole layer on it)."""
        start = self.absorbed
        feats = self.take_pending(state, start)
        n, device = feats.shape[0], feats.device
        self.pending = [feats[-1:]]
        if n <= 1:
            return None
        ids = torch.tensor(state.tokens[start + 1: start + n], device=device)
        return feats[:-1], ids, torch.arange(start, start + n - 1, device=device)

    # ------------------------------------------------------------------------------------ what profiling times
    @torch.inference_mode()
    def switching_probes(self, target, length: int, backlogs: list[int],
                         generator: torch.Generator) -> tuple[Callable[[], None], dict[int, Callable[[], None]]]:
        """What `profile --switching` times at base length `length` (WhiFlash Table 4/12), over random ids and
        features: one round (the draft over a `length`-row cache, then the target's verify of its tree; the
        target's cache holds `length` tokens) and, per backlog B, a switch's catch-up (KV-only rows for B-1
        tokens, the full layer on the newest, over length + B - 1 cached rows)."""
        draft, c, device = self.draft, self.draft.config, target.device
        most, L = max(backlogs), length
        ids = torch.randint(0, c.vocab, (L,), generator=generator).tolist()
        target.prefill(ids)
        feats = torch.randn(L + most, 3 * c.target_hidden, generator=generator).to(device, draft.fc.weight.dtype)
        tok = torch.randint(0, c.vocab, (L + most + 1,), generator=generator).to(device)
        before = draft.keys_values(feats[:L - 1], tok[1:L], torch.arange(L - 1, device=device))
        full = draft.keys_values(feats[:L], tok[1:L + 1], torch.arange(L, device=device))
        state = DecodeState(ids + [int(tok[L])], L, target, 0.0, None)

        def draft_round() -> DraftTree:
            self.kv, self.pending = before, [feats[L - 1:L]]  # a fixed state; advance() adds the newest row itself
            return self.propose(state)

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

        return one_round, {B: functools.partial(catch_up, B) for B in backlogs}

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

    @property
    def absorbed(self) -> int:
        """Committed positions already in the draft cache."""
        return 0 if self.kv is None else self.kv[0].shape[1]

    @torch.inference_mode()
    def advance(self, state: DecodeState) -> torch.Tensor:
        """Bring the draft up to the committed length and return its output at the newest position (feature
        t with token t+1), from which the tree grows."""
        self.catch_up(state)
        start = self.absorbed
        feats = self.take_pending(state, start)
        device = feats.device
        ids = torch.tensor(state.tokens[start + 1: start + 2], device=device)
        self.last_features = feats[-1]
        mask, extra = self._visible(causal_mask(1, start, device), start, [])
        out, (k, v) = self.draft.step(feats, ids, torch.arange(start, start + 1, device=device), self.kv, mask, extra)
        self.kv = append_kv(self.kv, (k, v))
        return out[-1]

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> DraftTree:
        self.extra_kv = self.shared_kv(state)
        last = self.advance(state)
        o = self.options
        with state.timed("draft_head"):
            first = self.draft.log_probs(last)
        hidden = last.expand(o.top_k, -1)
        tree_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        eye = torch.eye(o.top_k, dtype=torch.bool, device=last.device)
        ancestry = eye
        length = state.target.length

        def expand(tokens, rows, level):
            nonlocal hidden, ancestry
            if level > 0:
                hidden = hidden[rows]
                ancestry = torch.cat((ancestry[rows], eye), dim=1)
            ids = self.draft.to_target(tokens)
            positions = torch.full((o.top_k,), length + level, device=last.device)
            stable = self.kv[0].shape[1]
            mask = torch.cat((torch.ones(o.top_k, stable, dtype=torch.bool, device=last.device), ancestry), dim=1)
            mask, extra = self._visible(mask, stable, tree_kv)
            out, kv = self.draft.step(hidden, ids, positions, self.kv, mask, extra, features=False)
            tree_kv.append(kv)
            hidden = out
            with state.timed("draft_head"):
                return self.draft.log_probs(out)

        cands = beam_search(first, expand, o.top_k, o.depth)
        kept, parents = top_nodes(cands, o.total_token - 1)
        tokens = self.draft.to_target(cands.tokens[kept]).tolist()
        return DraftTree(tokens, parents)

    # ------------------------------------------------------------------------------------ batch > 1
    @torch.inference_mode()
    def propose_batch(self, forks: list[Eagle3], states: list[DecodeState]) -> list[DraftTree]:
        """Trees for a batch of sequences, every draft step one forward for all of them: the backlogs' keys and
        values, the newest positions (each over its own cache; the caches stacked and padded, `stack_kv`), then
        each tree level. Each sequence's tree is the one `propose` grows for it alone (the same search; the
        arithmetic of a batched forward may round differently)."""
        if len(forks) == 1:
            return [forks[0].propose(states[0])]
        o, draft, batch = self.options, self.draft, len(forks)
        self.catch_up_batch(forks, states)
        feats = torch.cat([f.take_pending(s, f.absorbed) for f, s in zip(forks, states)])  # [B, 3Ht], the newest
        device = feats.device
        starts = [f.absorbed for f in forks]
        empty = torch.zeros(draft.config.kv_heads, 0, draft.config.head_dim, device=device, dtype=feats.dtype)
        past, real = stack_kv([f.kv if f.kv is not None else (empty, empty) for f in forks])
        seen = torch.cat((real, torch.ones(batch, 1, dtype=torch.bool, device=device)), 1)  # + the newest
        ids = torch.tensor([[s.tokens[a + 1]] for s, a in zip(states, starts)], device=device)
        out, (k, v) = draft.step(feats[:, None], ids, torch.tensor(starts, device=device)[:, None], past, seen[:, None])
        for b, f in enumerate(forks):
            f.kv = append_kv(f.kv, (k[b], v[b]))
            f.last_features = feats[b]
        cache = (torch.cat((past[0], k), 2), torch.cat((past[1], v), 2))
        last = out[:, -1]
        with states[0].timed("draft_head"):
            first = draft.log_probs(last)
        length = torch.tensor([s.target.length for s in states], device=device)[:, None]
        eye = torch.eye(o.top_k, dtype=torch.bool, device=device).expand(batch, -1, -1)
        hidden, ancestry = last[:, None].expand(-1, o.top_k, -1), eye
        seen = seen[:, None].expand(-1, o.top_k, -1)
        tree_kv: list[tuple[torch.Tensor, torch.Tensor]] = []

        def expand(tokens, rows, level):
            nonlocal hidden, ancestry
            if level > 0:
                hidden = hidden.gather(1, rows[..., None].expand(-1, -1, hidden.shape[-1]))
                ancestry = torch.cat((ancestry.gather(1, rows[..., None].expand(-1, -1, ancestry.shape[-1])), eye), 2)
            extra = (torch.cat([t[0] for t in tree_kv], 2), torch.cat([t[1] for t in tree_kv], 2)) if tree_kv else None
            out, kv = draft.step(hidden, draft.to_target(tokens), (length + level).expand(-1, o.top_k), cache,
                                 torch.cat((seen, ancestry), 2), extra, features=False)
            tree_kv.append(kv)
            hidden = out
            with states[0].timed("draft_head"):
                return draft.log_probs(out)

        cands = beam_search(first, expand, o.top_k, o.depth)
        scores, tokens, parents = cands.scores.cpu(), draft.to_target(cands.tokens).cpu(), cands.parents.cpu()  # one read
        trees = []
        for b in range(batch):
            kept, tree_parents = top_nodes(Candidates(scores[b], tokens[b], parents[b]), o.total_token - 1)
            trees.append(DraftTree(tokens[b][kept].tolist(), tree_parents))
        return trees

    @torch.inference_mode()
    def catch_up_batch(self, forks: list[Eagle3], states: list[DecodeState]) -> None:
        """`catch_up` for every sequence, their backlogs' keys and values in one call."""
        backlogs = [(f, rows) for f, s in zip(forks, states) if (rows := f._backlog(s)) is not None]
        if not backlogs:
            return
        k, v = self.backlog_kv(*(torch.cat([rows[j] for _, rows in backlogs]) for j in range(3)))
        sizes = [rows[1].shape[0] for _, rows in backlogs]
        for (f, _), keys, values in zip(backlogs, k.split(sizes, 1), v.split(sizes, 1)):
            f.kv = append_kv(f.kv, (keys, values))
