"""DART (arXiv 2601.19278; reference fvliang/DART): one parallel draft forward plus an n-gram-guided tree search.

The draft is EAGLE-3's layer with `draft_length` mask slots appended after the context: one forward yields
draft_length + 1 next-token distributions (level l predicts l + 1 tokens past the root). The reference's
forward ends in the final RMSNorm and its `compute_logits` applies it again before lm_head; we match that.
Mask-slot K/V are dropped after the round; the cache keeps positions fed by target features only.

Tree search (DART Algorithm 1, the C++ `Searcher`): per level the top-25 draft tokens, softmax within
them; a beam of 20 partial sequences is extended by all 25 tokens with
    score += (l+1)^-0.7 · (0.9^l · ln(p_logit + 1e-10) + 0.5 · ln(p_ngram + 1e-10)),
no n-gram term at level 0, sequences ending in EOS sorted after all others when the beam is cut; every
extension enters a pool whose best 60 become the tree (60 drafted nodes + the root). The n-gram context
is the last (order − 1) tokens of (preceding ids + candidate prefix), where the preceding ids are the
prompt and root in the first round and, later, only the tokens committed in the last round (as the
reference passes them).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from specbench_cli.core.host_copy import to_device, to_host
from specbench_cli.core.method import DecodeState
from specbench_methods.checkpoints import Checkpoint, locate_file
from specbench_methods.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Layer
from specbench_methods.features import FeatureDrafter
from specbench_methods.layers import Apart, DraftKV, Slots, round_slots
from specbench_methods.ngram import Trie
from specbench_cli.core.tree import DraftTree


@dataclass
class SearchParams:
    # dart/tree_search/tree_search_config.py (the DART seed's Appendix D settings)
    top_k: int = 25
    beam_width: int = 20
    total: int = 60  # drafted nodes kept (the root comes on top)
    ngram_weight: float = 0.5
    level_decay: float = 0.7  # level_weight(l) = (l+1)^-0.7
    logit_decay: float = 0.9  # logit_weight(l) = 0.9^l
    # --opt ranges, checked before any model loads: (low, high), None = unbounded.
    RANGES = {"top_k": (1, 1024), "beam_width": (1, 1024), "total": (1, 1024), "ngram_weight": (0, None),
              "level_decay": (0, None), "logit_decay": (0, 1)}


def search(tokens: np.ndarray, probs: np.ndarray, trie: Trie | None, preceding: list[int], eos: frozenset[int],
           p: SearchParams) -> list[tuple[tuple[int, ...], float]]:
    """The kept sequences (root excluded) and their scores, best first.

    tokens/probs: [levels, k] candidate target ids per level and their probabilities within the top-k."""
    order = trie.order if trie is not None else 1
    use_ngram = trie is not None and p.ngram_weight > 0
    beam: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    pool: list[tuple[tuple[int, ...], float]] = []
    for level in range(tokens.shape[0]):
        level_w, logit_w = (level + 1) ** -p.level_decay, p.logit_decay ** level
        logit_term = np.log(probs[level] + 1e-10) * logit_w
        grown = []
        for seq, score in beam:
            term = logit_term
            if use_ngram and level > 0:  # the reference is built with NO_NGRAM_ON_FIRST_TOKEN
                term = term + p.ngram_weight * np.log(trie.probability(_context(preceding, seq, order), tokens[level]) + 1e-10)
            totals = score + level_w * term
            grown += [(seq + (int(t),), float(s)) for t, s in zip(tokens[level], totals)]
        pool += grown
        grown.sort(key=lambda c: (c[0][-1] in eos, -c[1]))  # stable: ties keep insertion order
        beam = grown[: p.beam_width]
    pool.sort(key=lambda c: -c[1])
    return pool[: p.total]


def _context(preceding: list[int], seq: tuple[int, ...], order: int) -> list[int]:
    want = order - 1
    if len(seq) >= want:
        return list(seq[len(seq) - want:])
    return preceding[len(preceding) - min(want - len(seq), len(preceding)):] + list(seq)


def to_tree(kept: list[tuple[tuple[int, ...], float]]) -> DraftTree:
    """Sequences sorted by length become nodes; each node's parent is its prefix's node."""
    ordered = sorted((seq for seq, _ in kept), key=len)
    index = {(): 0}
    tokens, parents = [], []
    for seq in ordered:
        if seq[:-1] not in index:  # cannot happen: scores never rise along a path and ties keep parents first
            continue
        index[seq] = len(tokens) + 1
        tokens.append(seq[-1])
        parents.append(index[seq[:-1]])
    return DraftTree(tokens, parents)


class DartLayer(Eagle3Layer):
    """EAGLE-3's layer with `slots` mask rows appended after the inputs: they attend with input `mask_rep` [2H]
    and carry its first H entries as residual."""

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__(c)
        self.slots = c.mask_slots
        self.mask_rep = nn.Parameter(torch.zeros(2 * c.hidden))

    def forward(self, emb, h, cos, sin, past=None, mask=None, extra=None, slots: int | None = None):
        """`slots` default to the config's, and then only the last real position and the slots go on; the
        trainer stacks one block per anchor (`slots` given) and keeps every row."""
        trim, slots = slots is None, self.slots if slots is None else slots
        x, residual = self.inputs(emb, h)
        if slots:  # after the inputs of each sequence (a batch's inputs are padded at the front)
            x = torch.cat((x, self.mask_rep.expand(*x.shape[:-2], slots, -1)), -2)
            residual = torch.cat((residual, self.mask_rep[: h.shape[-1]].expand(*h.shape[:-2], slots, -1)), -2)
        attn, kv = self.self_attn(x, cos, sin, past, mask, extra)
        h = residual + attn
        if trim and slots:
            h = h[..., -slots - 1:, :]
        return self.mlp_block(h), kv


class DartDraft(Eagle3Draft):
    """DART checkpoints: the flat EAGLE-3 layout plus `midlayer.mask_rep` [2H] and config `draft_length`; the
    embedding is always the target's (the reference overwrites any shipped copy, so one is ignored)."""

    kind = "DART"
    layer_class = DartLayer

    @classmethod
    def read_config(cls, ckpt: Checkpoint, target_layers: int) -> Eagle3Config:
        c = super().read_config(ckpt, target_layers)
        return replace(c, own_embedding=False, mask_slots=ckpt.need("draft_length"))

    @classmethod
    def ignored_tensors(cls, c: Eagle3Config) -> tuple[str, ...]:
        return (*super().ignored_tensors(c), "embed_tokens.weight")

    def export(self) -> tuple[dict, dict[str, torch.Tensor]]:
        config, tensors = super().export()
        return {**config, "draft_length": self.config.mask_slots}, tensors


ROW_BUCKETS = (1, 4, 16, 64)  # compiled: a round's new positions padded to one of these (a longer backlog runs eager)


class Dart(FeatureDrafter):
    name = "dart"
    drafter_names = ("dart",)
    inherent_syncs = "two per round: the top-k table for the host-side tree search, and the accepted length"
    optional_drafters = ("dart_ngram",)  # needed unless --opt trie=none

    @dataclass
    class Options(SearchParams):
        trie: str = "small.trie"  # file in the dart_ngram repo ("full.trie" for the paper's), or "none"

    @dataclass
    class Lane(FeatureDrafter.Lane):
        kv: DraftKV = field(default_factory=DraftKV)  # draft KV of the committed positions
        preceding: list[int] = field(default_factory=list)  # the tokens the trie's context starts from

    def __init__(self, options: Options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        self.draft = DartDraft.load(Checkpoint.read(self.drafter_ref("dart"), "dart"), model.model)
        self.capture = self.draft.config.capture
        self.trie = None if options.trie == "none" else load_trie(self.drafter_ref("dart_ngram"), options.trie)
        self.eos = frozenset(getattr(model, "stop_ids", ()) or ())

    def observe(self, state: DecodeState, new_tokens: list[int]) -> None:
        super().observe(state, new_tokens)
        self.lane(state).preceding = list(new_tokens)  # this round's accepted tokens + the new root

    @torch.inference_mode()
    def propose(self, states: list[DecodeState]) -> list[DraftTree]:
        """Trees for a batch of sequences: one draft forward over every sequence's unseen positions and mask
        slots (inputs padded at the front, so each sequence's last position and slots end every row; the draft
        caches stacked and padded, `round_slots`), then each sequence's tree search on the host."""
        draft, batch, slots = self.draft, len(states), self.draft.config.mask_slots
        lanes = [self.lane(s) for s in states]
        starts = [lane.kv.length for lane in lanes]
        feats = [self.take_pending(s, a) for s, a in zip(states, starts)]
        device, rows = feats[0].device, self.rows(max(x.shape[0] for x in feats))
        width = rows + slots
        h = torch.zeros(batch, rows, feats[0].shape[1], device=device, dtype=feats[0].dtype)
        ids = torch.zeros(batch, rows, dtype=torch.long, device=device)
        positions = torch.zeros(batch, width, dtype=torch.long, device=device)
        own = torch.zeros(batch, width, width, dtype=torch.bool, device=device)
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        for b, (x, s, a) in enumerate(zip(feats, states, starts)):
            n = x.shape[0]
            h[b, rows - n:] = x
            ids[b, rows - n:] = to_device(s.tokens[a + 1: a + n + 1], device)
            positions[b, rows - n:] = torch.arange(a, a + n + slots, device=device)
            own[b] = causal
            own[b, :, :rows - n] = False  # nobody sees the padding rows but themselves
            own[b].diagonal().fill_(True)
        like = torch.empty(draft.config.kv_heads, 0, draft.config.head_dim, device=device, dtype=h.dtype)
        slots, real = round_slots([lane.kv for lane in lanes], width, like)  # the step writes its keys in place
        mask = torch.cat((real[:, None].expand(-1, width, -1), own), 2)
        out, (k, v) = self._step(h, ids, positions, slots, mask)
        for b, (lane, x) in enumerate(zip(lanes, feats)):  # mask slots are not kept
            lane.kv.append(k[b, :, rows - x.shape[0]:rows], v[b, :, rows - x.shape[0]:rows])
        with states[0].timed("draft_head"):
            logits = self.run_step("head", self._logits, out)
        return [self.search_tree(lane, lg) for lane, lg in zip(lanes, logits)]

    def _step(self, h: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, slots: Slots, mask: torch.Tensor):
        """The round's draft forward: eager, it writes its keys into `slots` and attends in place; compiled (rows
        of a bucket), one graph reads the whole buffers (`Apart`). The keys it returns are what the caches keep."""
        if self.graphs is None or h.shape[1] not in ROW_BUCKETS:
            return self.draft.step(h, ids, positions, slots, mask)
        return self.graphs("step", self._apart_step, h, ids, positions, slots.k, slots.v, Apart.mask(mask, slots))

    def _logits(self, out: torch.Tensor) -> torch.Tensor:
        """The levels' logits [B, 1 + mask slots, draft vocab] from the step's outputs, after the reference's second
        RMSNorm."""
        return self.draft.logits(self.draft.norm(out))

    def rows(self, pending: int) -> int:
        """A round's input rows for `pending` new positions: compiled, the smallest bucket that fits (padding rows
        at the front, which no real row sees); a longer backlog (the prompt) and an eager run: as many as there are."""
        fits = [b for b in ROW_BUCKETS if b >= pending] if self.graphs is not None else []
        return fits[0] if fits else pending

    # ------------------------------------------------------------------------------------ compiled
    def start(self, state: DecodeState) -> None:
        super().start(state)
        lane = self.lane(state)
        lane.preceding = list(state.tokens)  # prompt + root
        lane.kv.fixed(self.capacity)  # compiled: one buffer shape for every round (eager: 0, growing)

    def round_room(self) -> int:
        return ROW_BUCKETS[-1] + self.draft.config.mask_slots

    @torch.inference_mode()
    def warm_steps(self, batch: int) -> None:
        """The round's forward for each bucket of new positions, and the head (one shape for all)."""
        c, weight, slots = self.draft.config, self.draft.fc.weight, self.blank_slots(batch)
        for rows in ROW_BUCKETS:
            width = rows + c.mask_slots
            ids, positions = (torch.zeros(batch, n, dtype=torch.long, device=self.device) for n in (rows, width))
            out, _ = self._step(weight.new_zeros(batch, rows, 3 * c.target_hidden), ids, positions, slots,
                                self.own_keys_only(batch, width))
        self.run_step("head", self._logits, out)  # [B, 1 + mask slots, H] whatever the rows

    def search_tree(self, lane: Lane, logits: torch.Tensor) -> DraftTree:
        """The tree the n-gram-guided search grows from the levels' logits [draft_length + 1, draft vocab]."""
        top = logits.topk(min(self.options.top_k, logits.shape[-1]), dim=-1)
        tokens, probs = to_host(self.draft.to_target(top.indices), torch.softmax(top.values, dim=-1))  # one read;
        # temperature 1 inside the search
        return to_tree(search(tokens.numpy(), probs.numpy(), self.trie, lane.preceding, self.eos, self.options))


def load_trie(ref: str, filename: str) -> Trie:
    return Trie.load(locate_file(ref, filename, "DART n-gram trie"))

