"""Training recipes for `specbench train-drafter`: one module per drafter, one interface for the loop.

A recipe builds the trainable drafter for a target (`model`; constructors take `(target, corpus, settings)`,
and the feature drafters' also config fields to set by keyword), turns one corpus sequence into a loss and
per-position top-1 counts (`loss`), and writes the drafter in its method's loader format (`export`). The
loop in `specbench_cli/training/train.py` owns everything else: data split, optimiser, evaluation, resume
state and the card.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specbench_cli.commands.train.distill import Corpus
from specbench_cli.core.errors import UsageError


@dataclass
class Sample:
    """One training sequence: token ids, the target's greedy next token per position, its features."""

    ids: torch.Tensor  # [T]
    nxt: torch.Tensor  # [T] the target's greedy token after position t
    feats: torch.Tensor  # [T, len(layers) * H] (empty when the recipe reads no features)
    prompt_len: int
    topk_ids: torch.Tensor | None = None  # [T, k] the target's most likely next tokens (KL recipes)
    topk_probs: torch.Tensor | None = None  # [T, k] their probabilities


class Recipe:
    """What every recipe provides (see the module docstring)."""

    layers: list[int]  # target layers whose outputs each Sample carries
    positions: int  # how many draft positions the held-out top-1 accuracy is reported for
    needs_topk: bool = False
    model: torch.nn.Module

    def loss(self, sample: Sample) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        raise NotImplementedError

    def export(self, out: Path) -> None:
        raise NotImplementedError


def check_layers(corpus: Corpus, layers: list[int]) -> None:
    """The corpus must hold the features of every target layer a drafter reads."""
    missing = [l for l in layers if l not in corpus.layers]
    if missing:
        raise UsageError(f"corpus {corpus.where} has no features for target layers {missing}")


def pick_anchors(first: int, last: int, count: int, training: bool, device: torch.device) -> torch.Tensor:
    """Up to `count` anchors in [first, last]: random when training, evenly spaced (fixed) when evaluating.

    Drawn on the CPU from its seeded generator, then moved to `device`: a seed gives the same anchors on every
    machine, and no CUDA generator is involved. (Recipes name the device of every tensor they make.)"""
    n, cpu = last - first + 1, torch.device("cpu")
    if n <= 0:
        anchors = torch.empty(0, dtype=torch.long, device=cpu)
    elif n <= count:
        anchors = torch.arange(first, last + 1, device=cpu)
    elif training:
        anchors = first + torch.randperm(n, device=cpu)[:count].sort().values
    else:
        anchors = torch.linspace(first, last, count, device=cpu).round().long().unique()
    return anchors.to(device)


def half(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Floating tensors to fp16 (the committed drafters' dtype); index tensors unchanged."""
    return {k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}


def top1(logits: torch.Tensor, labels: torch.Tensor) -> tuple[int, int]:
    """(correct, counted) argmax hits over labels that are not the ignore index -100."""
    valid = labels >= 0
    return int((logits.argmax(-1) == labels)[valid].sum()), int(valid.sum())


def kl_to_topk(log_q: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Mean over rows of KL(p || q) where p is the target's top-k distribution with the rest of its mass in
    one "other" outcome, and q the draft's on the same k + 1 outcomes (an exact KL, never negative).

    log_q [N, V'] draft log-probabilities; ids [N, k] index into V' (−100 = outside the draft vocabulary:
    that probability moves to "other"); probs [N, k] the target's probabilities under its full softmax."""
    keep = ids >= 0
    p = torch.where(keep, probs, torch.zeros_like(probs))
    q = torch.where(keep, log_q.gather(1, ids.clamp(min=0)).exp(), torch.zeros_like(probs))
    p_other = (1 - p.sum(1, keepdim=True)).clamp(min=1e-8)
    q_other = (1 - q.sum(1, keepdim=True)).clamp(min=1e-8)
    p, q = torch.cat((p, p_other), 1), torch.cat((q, q_other), 1)
    terms = torch.where(p > 0, p * (torch.log(p.clamp(min=1e-8)) - torch.log(q.clamp(min=1e-8))), torch.zeros_like(p))
    return terms.sum(1).mean()
