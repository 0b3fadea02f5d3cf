"""EAGLE's tree search (SafeAILab `topK_genrate`): a top-k beam over the draft's log-probs, then the
global top nodes by cumulative score."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Candidates:
    """Every node the beam search scored, in recording order: its cumulative log-prob, token, parent.

    `parent` is 0 for a child of the root, else 1 + the parent's recording index (EAGLE's convention)."""

    scores: torch.Tensor
    tokens: torch.Tensor
    parents: torch.Tensor


def beam_search(first: torch.Tensor, expand, top_k: int, depth: int) -> Candidates:
    """EAGLE's `topK_genrate` beam: level 1 is the top-k of `first` (log-probs [V]); then `depth` times the
    frontier (k nodes) is expanded by `expand(tokens, rows, level) -> log-probs [k, V]`, every child gets
    parent score + its log-prob, all k² are recorded, and the best k become the next frontier.

    `rows` says which earlier frontier node each new frontier node came from (the caller keeps per-node
    state such as the draft's hidden output); tokens are draft-vocabulary ids.

    A batch of sequences searches at once with one more leading dimension (`first` [B, V], `expand` -> [B, k, V];
    Candidates of [B, nodes])."""
    top = torch.topk(first, top_k)
    scores, tokens = top.values, top.indices
    lead = scores.shape[:-1]
    record_s, record_t = [scores], [tokens]
    record_p = [torch.zeros_like(tokens)]
    frontier = torch.arange(top_k, device=first.device).expand_as(tokens)  # recording indices of the frontier nodes
    rows = frontier
    offset = top_k
    for level in range(depth):
        logp = expand(tokens, rows, level)  # [(B,) k, V]
        top = torch.topk(logp, top_k, dim=-1)
        cumulative = (top.values + scores[..., None]).reshape(*lead, -1)
        children = top.indices.reshape(*lead, -1)
        record_s.append(cumulative)
        record_t.append(children)
        record_p.append((frontier + 1).repeat_interleave(top_k, dim=-1))
        best = torch.topk(cumulative, top_k).indices
        scores, tokens, rows = cumulative.gather(-1, best), children.gather(-1, best), best // top_k
        frontier = offset + best
        offset += top_k * top_k
    return Candidates(torch.cat(record_s, -1), torch.cat(record_t, -1), torch.cat(record_p, -1))


def top_nodes(c: Candidates, total: int) -> tuple[list[int], list[int]]:
    """The global top `total` candidates by score, in recording order (parents before children).

    Returns (kept recording indices, tree parents with 0 = root). A child never outscores its parent and
    ties go to the earlier recording index, so every kept node's parent is kept too."""
    scores, recorded_parents = c.scores.tolist(), c.parents.tolist()  # the one read of the scores
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:total]
    kept = sorted(order)
    where = {idx: pos + 1 for pos, idx in enumerate(kept)}
    parents = [0 if recorded_parents[i] == 0 else where[recorded_parents[i] - 1] for i in kept]
    return kept, parents
