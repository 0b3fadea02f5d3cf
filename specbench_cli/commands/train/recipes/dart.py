"""DART prefix-shared masked training (DART seed §3; annealed KL weights from its Table 4).

One pass per sequence: the context rows are EAGLE-3's (feature t with token t+1, causal) and every
context row is level 0 for its position; after them, one block of `draft_length` mask slots per sampled
anchor a, at positions a+1.. , seeing the context up to a and the block's earlier slots (the inference
mask). The prefix is computed once and shared by all anchors. Level l of anchor a is trained towards the
target's distribution of the token at a+1+l (top-k KL from the corpus) with weight γ^l, γ = 0.6.
Logits go through the final norm twice, as the reference's inference does.

The n-gram trie for the tree search is built from the same corpus (prompts and answers, each ending in
its stop token) in the `.trie` format and written beside the draft as `small.trie`, the file the method
opens by default.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specbench_methods.checkpoints import save
from specbench_methods.dart import DartDraft
from specbench_methods.layers import causal_mask
from specbench_methods.ngram import Trie
from specbench_cli.commands.train.distill import Corpus
from specbench_cli.commands.train.recipes import Recipe, Sample, half, kl_to_topk, pick_anchors, top1
from specbench_cli.commands.train.recipes.eagle3 import start_draft

TRIE_ORDER = 3  # the reference ngram_build.py default


class DartRecipe(Recipe):
    needs_topk = True

    def __init__(self, target: torch.nn.Module, corpus: Corpus, s, **shape) -> None:
        self.model = start_draft(target, corpus, s, DartDraft, s.slots, **shape)
        self.corpus = corpus
        self.layers = self.model.config.capture
        slots = self.model.config.mask_slots  # the checkpoint's, with --init
        self.positions = slots + 1
        self.anchors = s.anchors
        self.weights = [s.gamma ** l for l in range(slots + 1)]
        self.to_draft = self.model.to_draft()

    def level_outputs(self, sample: Sample, anchors: torch.Tensor) -> torch.Tensor:
        """Draft outputs of every context row [T−1 rows] followed by each anchor's `draft_length` slot rows."""
        draft, S = self.model, self.model.config.mask_slots
        T, N, device = sample.ids.shape[0] - 1, anchors.shape[0], sample.ids.device  # context rows: feature t, token t+1
        owner = torch.arange(N, device=device).repeat_interleave(S)
        slot = torch.arange(S, device=device).repeat(N)
        positions = torch.cat((torch.arange(T, device=device), anchors[owner] + 1 + slot))
        slot_rows = torch.cat((torch.arange(T, device=device)[None] <= anchors[owner][:, None],
                               (owner[:, None] == owner[None]) & (slot[None] <= slot[:, None])), dim=1)
        context_rows = torch.cat((causal_mask(T, 0, device), torch.zeros(T, N * S, dtype=torch.bool, device=device)), 1)
        out, _ = draft.step(sample.feats[:T], sample.ids[1:T + 1], positions, mask=torch.cat((context_rows, slot_rows)),
                            slots=N * S)
        return out

    def loss(self, sample: Sample) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        draft, S = self.model, self.model.config.mask_slots
        T, device = sample.ids.shape[0] - 1, sample.ids.device
        last = T - 2  # the last row whose level-0 label (the token at t+2) is inside the sequence
        first = min(max(sample.prompt_len - 2, 0), last)
        anchors = pick_anchors(first, last - 1, self.anchors, draft.training, device)
        out = self.level_outputs(sample, anchors)
        rows = [torch.arange(first, last + 1, device=device)] + [T + torch.arange(anchors.shape[0], device=device) * S + (l - 1)
                                                                 for l in range(1, S + 1)]
        labels_at = [rows[0] + 1] + [anchors + 1 + l for l in range(1, S + 1)]  # level l of row a: token at a+2+l
        total, stats = torch.zeros((), device=device), []
        for l, (r, q) in enumerate(zip(rows, labels_at)):
            keep = q <= T - 1  # the target's distribution of the token at q+1 is row q of the corpus
            r, q = r[keep], q[keep]
            if r.numel() == 0:
                stats.append((0, 0))
                continue
            log_q = torch.log_softmax(draft.logits(draft.norm(out[r])), dim=-1)
            total = total + self.weights[l] * kl_to_topk(log_q, self.to_draft[sample.topk_ids[q]], sample.topk_probs[q])
            stats.append(top1(log_q, self.to_draft[sample.nxt[q]]))
        return total, stats

    def export(self, out: Path) -> None:
        config, tensors = self.model.export()
        save(out, config, half(tensors))
        Trie.build(self.corpus.sequences, TRIE_ORDER).save(out / "small.trie")
