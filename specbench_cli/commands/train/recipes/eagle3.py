"""EAGLE-3 training-time test, as SpecForge trains it.

Step 0 feeds target features with the next tokens and predicts the target's greedy token two ahead; step j
feeds the draft's own step-(j-1) outputs with tokens shifted by j and predicts j tokens further. Position t
at step j attends to the step-0 keys up to t (the real prefix, causal) and to its own keys of steps 1..j
(the diagonal) — the training-time image of a depth-j tree node seeing the prefix and its ancestors.
Cross-entropy on the draft vocabulary (the most frequent target tokens of the corpus); RoPE position t + j,
as the node would have.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from specbench_methods.checkpoints import Checkpoint, save
from specbench_methods.eagle3 import Eagle3Config, Eagle3Draft, default_capture
from specbench_methods.layers import causal_mask
from specbench_cli.commands.train.distill import Corpus
from specbench_cli.commands.train.recipes import Recipe, Sample, check_layers, half, top1


def new_draft(target: torch.nn.Module, corpus: Corpus, draft_vocab: int, intermediate: int, capture: list[int],
              draft_class: type[Eagle3Draft] = Eagle3Draft, mask_slots: int = 0, **shape) -> Eagle3Draft:
    """A one-layer EAGLE-3-layout draft for this target (DART's class adds mask slots); its vocabulary = the
    corpus' most frequent tokens, ascending. `shape`: Eagle3Config fields set instead of these choices (the
    tests' format variants: speculators layout, head dims unlike the target's, q/k norm)."""
    t = target.config
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    vocab = t.vocab_size
    c = Eagle3Config(hidden=t.hidden_size, target_hidden=t.hidden_size, heads=t.num_attention_heads,
                     kv_heads=t.num_key_value_heads, head_dim=head_dim, intermediate=intermediate,
                     eps=t.rms_norm_eps, rope_theta=float(getattr(t, "rope_theta", None) or 10000.0), rope_scaling=None,
                     draft_vocab=min(draft_vocab, vocab), vocab=vocab, capture=capture, norm_before_residual=False,
                     qk_norm=False, layer_prefix="midlayer.", own_embedding=False, mask_slots=mask_slots)
    c = replace(c, **shape)
    check_layers(corpus, c.capture)
    draft = draft_class(c, target.get_input_embeddings().weight.detach())
    draft.choose_vocab(corpus.sequences)
    return draft


def start_draft(target: torch.nn.Module, corpus: Corpus, s, draft_class: type[Eagle3Draft] = Eagle3Draft,
                mask_slots: int = 0, **shape) -> Eagle3Draft:
    """The draft a run starts from: the checkpoint `s.init` (its shape and vocabulary, trainable in float32)
    when one is given, else a new one shaped by `s` and `shape` (DART's class with its `mask_slots`)."""
    if not s.init:
        return new_draft(target, corpus, s.draft_vocab, s.intermediate,
                         default_capture(target.config.num_hidden_layers), draft_class, mask_slots, **shape)
    draft = draft_class.load(Checkpoint.read(s.init, draft_class.kind), target).float().train()  # ConFu reads an EAGLE-3
    check_layers(corpus, draft.config.capture)
    return draft


class Eagle3Recipe(Recipe):
    def __init__(self, target: torch.nn.Module, corpus: Corpus, s, **shape) -> None:
        self.model = start_draft(target, corpus, s, **shape)
        self.layers = self.model.config.capture
        self.positions = s.ttt
        self.to_draft = self.model.to_draft()

    def loss(self, sample: Sample) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        return ttt_loss(self.model, sample.feats, sample.ids, sample.nxt, self.positions, self.to_draft)

    def export(self, out: Path) -> None:
        config, tensors = self.model.export()
        save(out, config, half(tensors))


def ttt_loss(draft: Eagle3Draft, feats: torch.Tensor, ids: torch.Tensor, nxt: torch.Tensor, ttt: int,
             to_draft: torch.Tensor, future: tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Mean cross-entropy over TTT steps, and (correct, counted) top-1 per step.

    `future` (ConFu): keys/values of extra entries [heads, F, d] and which positions see them [T, F]; a
    position sees its entries at every TTT step, as a round's draft queries all see that round's [f]."""
    T = ids.shape[0] - 1  # positions t = 0..T-1 take feature t and token t+1
    h, past, extra = feats[:T], None, []
    losses, stats = [], []
    for j in range(ttt):
        n = T - j - 1  # positions whose label (the target's token at t+2+j) exists
        if n <= 0:
            break
        tokens = ids[1 + j: 1 + j + T]  # position t reads token t+1+j; the tail beyond the sequence is padding
        tokens = torch.nn.functional.pad(tokens, (0, T - tokens.shape[0]), value=int(ids[-1]))
        eye = torch.eye(T, dtype=torch.bool, device=ids.device)
        prefix = causal_mask(T, 0, ids.device)  # step 0: this call's own keys; later steps: the cached step-0 keys
        columns = [prefix] + ([future[1][:T]] if future else []) + [eye] * j
        kvs = ([future[0]] if future else []) + extra
        extra_kv = (torch.cat([k for k, _ in kvs], 1), torch.cat([v for _, v in kvs], 1)) if kvs else None
        if j == 0 and future:  # keys are ordered past, extra, own: step 0 has no past, its own keys come last
            columns = [future[1][:T], prefix]
        out, kv = draft.step(h, tokens, torch.arange(T, device=ids.device) + j, past, torch.cat(columns, dim=1),
                             extra_kv, features=j == 0)
        if j == 0:
            past = kv
        else:
            extra.append(kv)
        labels = to_draft[nxt[1 + j: 1 + j + n]]
        logits = draft.logits(out[:n])
        losses.append(torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100))
        stats.append(top1(logits, labels))
        h = out
    return torch.stack(losses).mean(), stats
