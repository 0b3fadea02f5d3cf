"""Which draft tokens the target accepts, and the bonus token that follows them.

Greedy (temperature 0): walk from the root, following the child whose token equals the target's argmax;
the argmax at the last accepted node is the bonus token. The output is exactly the target's greedy text.

Sampling (temperature > 0): recursive rejection sampling over siblings (SpecInfer; Leviathan et al. for
a chain). At a node with target distribution p, try its children in order: child x drawn from q is
accepted with probability min(1, p(x)/q(x)); on rejection p <- normalise(max(p - q, 0)). When no child is
accepted (or there is none) the bonus token is drawn from the current p. Each accepted token and the
bonus are then distributed exactly as the target's own samples. A node without a draft distribution is
a point mass on its token (q = one-hot), so its rejection just removes x from p.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specbench_cli.core.host_copy import to_device
from specbench_cli.core.tree import DraftTree, read_trees

# A sequence's value to read with its round's acceptance, from the index of its last accepted node (a one-element
# long tensor on the device, `greedy_node`); the value stays on the device until that read.
ReadAhead = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Acceptance:
    path: list[int]  # accepted node indices, root (0) first
    tokens: list[int]  # accepted draft tokens followed by the bonus token
    ahead: torch.Tensor | None = None  # the host copy of the sequence's `ReadAhead` value, where it had one

    @property
    def accepted(self) -> int:
        """Draft tokens accepted, bonus excluded."""
        return len(self.path) - 1


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax over the last dim (the first maximal index, as `torch.argmax` defines it), through `max`:
    PyTorch's argmax over bf16 logits on a CPU is much slower than `max`, both for a 61-node tree's rows
    of a 49,152-token vocabulary and for one row; `torch.max(dim)` also returns the first maximal index."""
    return logits.max(dim=-1).indices


def accept(tree: DraftTree, logits: torch.Tensor, temperature: float,
           generator: torch.Generator | None = None) -> Acceptance:
    if temperature <= 0:
        return accept_greedy(tree, logits)
    return accept_sampling(tree, logits, temperature, generator)


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> Acceptance:
    return accept_greedy_all([tree], [logits])[0]


def accept_greedy_all(trees: list[DraftTree], logits: list[torch.Tensor],
                      ahead: Sequence[ReadAhead | None] = ()) -> list[Acceptance]:
    """Greedy acceptance of a round's sequences: their argmaxes, whatever of their trees is still on the device and
    the values `ahead` computes at each sequence's last accepted node (where it has an entry), read in one go (the
    round's one host sync)."""
    bests = [greedy_tokens(lg) for lg in logits]
    later = [(i, read(greedy_node(trees[i], bests[i]))) for i, read in enumerate(ahead) if read is not None]
    host = read_trees(trees, bests + [value for _, value in later])
    results = [_greedy_walk(tree, best.tolist()) for tree, best in zip(trees, host)]
    for (i, _), value in zip(later, host[len(trees):]):
        results[i].ahead = value
    return results


def greedy_node(tree: DraftTree, best: torch.Tensor) -> torch.Tensor:
    """The greedy walk's last node (`_greedy_walk`'s) as a one-element long tensor where `best` (each node's
    argmax, root first) is, without reading anything: a node is on the walk when it and each of its ancestors is
    the first child, in node order, whose token is its parent's argmax; the walk's last node is its deepest."""
    device = best.device
    if len(tree) == 0:
        return torch.zeros(1, dtype=torch.long, device=device)
    parents = tree.parent_ids(device)
    hit = tree.ids(device) == best[parents]
    n = hit.numel()
    earlier_sibling = torch.ones(n, n, dtype=torch.bool, device=device).tril(-1) & (parents[:, None] == parents)
    first = hit & ~(earlier_sibling & hit).any(-1)
    ancestors = to_device(tree.mask(), device)  # [N+1, N+1], each row's ancestors and itself
    on_walk = ~(ancestors & ~torch.cat((first.new_ones(1), first))).any(-1)
    return (ancestors.sum(-1) * on_walk).argmax().view(1)


def _greedy_walk(tree: DraftTree, best: list[int]) -> Acceptance:
    children = tree.children()
    node, path, tokens = 0, [0], []
    while True:
        nxt = next((c for c in children[node] if tree.tokens[c - 1] == best[node]), None)
        if nxt is None:
            return Acceptance(path, tokens + [best[node]])
        node = nxt
        path.append(node)
        tokens.append(tree.tokens[node - 1])


def accept_sampling(tree: DraftTree, logits: torch.Tensor, temperature: float,
                    generator: torch.Generator | None) -> Acceptance:
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    children = tree.children()
    node, path, tokens = 0, [0], []
    while True:
        p = probs[node]
        accepted_child = None
        for child in children[node]:
            x = tree.tokens[child - 1]
            q = None if tree.draft_probs is None else tree.draft_probs[child - 1].to(p)
            qx = 1.0 if q is None else float(q[x])
            if _uniform(generator, p.device) * qx < float(p[x]):  # u < p(x)/q(x), without dividing by 0
                accepted_child = child
                break
            p = _residual(p, x, q)
        if accepted_child is None:
            bonus = int(torch.multinomial(p, 1, generator=generator))
            return Acceptance(path, tokens + [bonus])
        node = accepted_child
        path.append(node)
        tokens.append(tree.tokens[node - 1])


def _uniform(generator: torch.Generator | None, device: torch.device) -> float:
    return float(torch.rand((), generator=generator, device=device))


def _residual(p: torch.Tensor, x: int, q: torch.Tensor | None) -> torch.Tensor:
    """normalise(max(p - q, 0)); for a point mass q that is p with x removed."""
    if q is None:
        r = p.clone()
        r[x] = 0.0
    else:
        r = (p - q).clamp_min(0.0)
    total = r.sum()
    # total == 0 only if p <= q everywhere, i.e. the child was accepted surely; keep p as a safe fallback.
    return r / total if float(total) > 0 else p


@dataclass
class SyntheticAcceptance:
    """An accept decision the user sets, to price a method at an acceptance its drafter does not reach here
    (`--acceptance synthetic:RATE` or `profile:FILE`): the drafter drafts and the target verifies at full cost;
    only the decision is replaced. Along one path of the draft, each node's first child in node order (the
    drafter's best-ranked candidate under it), the child at depth d is accepted with probability `rates[d - 1]`
    (the last rate for deeper ones) given that its parent was; the bonus is the target's own token at the last
    accepted node. Not lossless by construction. The decisions come from a host generator of their own, so they
    add no device synchronisation and do not touch the sampling generators."""

    rates: tuple[float, ...]
    seed: int = 0
    draws: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.draws = random.Random(self.seed)

    def accept(self, tree: DraftTree, logits: torch.Tensor, temperature: float,
               generator: torch.Generator | None = None) -> Acceptance:
        children = tree.children()
        node, path, tokens = 0, [0], []
        while children[node] and self.draws.random() < self.rates[min(len(tokens), len(self.rates) - 1)]:
            node = children[node][0]
            path.append(node)
            tokens.append(tree.tokens[node - 1])
        return Acceptance(path, tokens + [pick(logits[node], temperature, generator)])


def pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Sample (or take the argmax of) one token from next-token logits [V]."""
    return int(pick_on_device(logits, temperature, generator))


def pick_on_device(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """`pick`'s token as a one-element tensor where the logits are, not read."""
    if temperature <= 0:
        return greedy_tokens(logits).view(1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)
