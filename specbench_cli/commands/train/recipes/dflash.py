"""DFlash block training (the DFlash paper §3.3; SpecForge / Model-Optimizer `dflash` recipes).

Anchors a are sampled from the response. Each anchor's block is [token a, mask × (B−1)] at positions
a..a+B−1; it sees the target-feature context of positions < a (as at inference, where the block starts at
the first position without features) and its own block, non-causally; blocks never see each other, so
many blocks share one pass over the context. Block position j is trained to the target's greedy token
at a+j with weight exp(−(j−1)/γ), γ = 4 for B = 8 (the paper's decay; Model-Optimizer's dflash.yaml
defaults: block 8, decay 4). The draft uses the target's embedding and head, which stay frozen.

The mask token is the lowest token id that never occurs in the distillation corpus (its embedding is the
target's, frozen, as for the released drafters' special mask token).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import torch

from specbench_methods.checkpoints import Checkpoint, save
from specbench_methods.dflash import DFlashConfig, DFlashDraft, default_capture
from specbench_cli.commands.train.distill import Corpus
from specbench_cli.commands.train.recipes import Recipe, Sample, check_layers, half, pick_anchors, top1

DECAY = {16: 7.0, 10: 5.0, 8: 4.0}  # loss decay γ per block size (DFlash paper, training details)


def unused_token(corpus: Corpus, vocab: int) -> int:
    seen = torch.zeros(vocab, dtype=torch.bool)
    seen[torch.tensor([t for seq in corpus.sequences for t in seq])] = True
    return int((~seen).nonzero()[0])


def new_config(target: torch.nn.Module, corpus: Corpus, s, **shape) -> DFlashConfig:
    t = target.config
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    c = DFlashConfig(hidden=t.hidden_size, heads=t.num_attention_heads, kv_heads=t.num_key_value_heads,
                     head_dim=head_dim, intermediate=s.intermediate, layers=s.draft_layers or 1,
                     eps=t.rms_norm_eps, rope_theta=float(getattr(t, "rope_theta", None) or 10000.0),
                     rope_scaling=None, capture=default_capture(t.num_hidden_layers), block_size=s.block_size,
                     mask_token_id=unused_token(corpus, t.vocab_size))
    return replace(c, **shape)


class DFlashRecipe(Recipe):
    def __init__(self, target: torch.nn.Module, corpus: Corpus, s, **shape) -> None:
        """`shape`: DFlashConfig fields set instead of these choices (tests pin the mask token and layers).
        With `s.init` the draft starts from that checkpoint: its shape and mask token, trainable in float32."""
        t = target.config
        if s.init:
            self.model = DFlashDraft.load(Checkpoint.read(s.init, "dflash"), target).float().train()
        else:
            self.model = DFlashDraft(new_config(target, corpus, s, **shape), target)
        c = self.model.config
        check_layers(corpus, c.capture)
        self.target_layers = t.num_hidden_layers
        self.layers = c.capture
        self.positions = c.block_size - 1
        self.anchors = s.anchors
        gamma = DECAY.get(c.block_size, 4.0)
        self.weights = torch.tensor([math.exp(-j / gamma) for j in range(c.block_size - 1)])

    def block_logits(self, sample: Sample, anchors: torch.Tensor) -> torch.Tensor:
        """Logits [N, B−1, V] of the masked positions of one block per anchor, all in one pass."""
        c, T, N, device = self.model.config, sample.ids.shape[0], anchors.shape[0], sample.ids.device
        B = c.block_size
        block = torch.full((N, B), c.mask_token_id, device=device)
        block[:, 0] = sample.ids[anchors]
        positions = (anchors[:, None] + torch.arange(B, device=device)).reshape(-1)
        owner = torch.arange(N, device=device).repeat_interleave(B)
        sees_context = torch.arange(T, device=device)[None] < anchors[owner][:, None]
        mask = torch.cat((sees_context, owner[:, None] == owner[None]), dim=1)
        hidden, _ = self.model(sample.feats, 0, block.reshape(-1), 0, positions=positions, mask=mask)
        return self.model.logits(hidden.view(N, B, -1)[:, 1:])

    def loss(self, sample: Sample) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        B, T, device = self.model.config.block_size, sample.ids.shape[0], sample.ids.device
        anchors = pick_anchors(max(sample.prompt_len - 1, 1), T - 2, self.anchors, self.model.training, device)
        logits = self.block_logits(sample, anchors)
        where = anchors[:, None] + torch.arange(1, B, device=device) - 1  # label of block position j = greedy token after a+j-1
        labels = torch.where(where <= T - 2, sample.nxt[where.clamp(max=T - 1)], torch.full_like(where, -100))
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
        w = self.weights.to(device)[None] * (labels >= 0)
        loss = (ce * w).sum() / w.sum().clamp(min=1e-6)
        return loss, [top1(logits[:, j], labels[:, j]) for j in range(B - 1)]

    def export(self, out: Path) -> None:
        config, tensors = self.model.export(self.target_layers)
        save(out, config, half(tensors))
