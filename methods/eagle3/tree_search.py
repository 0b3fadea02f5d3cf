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


def top_nodes(c: Candidates, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global top `total` candidates by score, in recording order (parents before children), on the
    candidates' device and for any leading batch dimensions, without reading them on the host.

    Returns (kept recording indices, tree parents with 0 = root), each [..., total]. A child never outscores its
    parent and ties go to the earlier recording index (a stable sort), so every kept node's parent is kept too."""
    total = min(total, c.scores.shape[-1])
    kept = torch.sort(c.scores, dim=-1, descending=True, stable=True).indices[..., :total].sort(dim=-1).values
    node = torch.zeros_like(c.parents).scatter_(  # recording index -> its tree node (1-based), for the kept
        -1, kept, torch.arange(1, total + 1, device=kept.device).expand_as(kept))
    recorded = c.parents.gather(-1, kept)  # 0 = the root, else 1 + the parent's recording index
    return kept, torch.where(recorded == 0, 0, node.gather(-1, (recorded - 1).clamp_min(0)))
