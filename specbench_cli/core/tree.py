"""DraftTree: what every proposer returns. A chain is a tree whose parents are 0, 1, 2, ...

Node indices are 1..N; index 0 is the root, the last committed token, which the verify forward feeds
first because its KV entry is not in the cache yet. `parents[i]` is the parent of node i+1 (0 = root),
and parents always come before their children.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)  # node i+1's token
    parents: list[int] = field(default_factory=list)  # node i+1's parent index (0 = root)
    # Optional draft distributions, one row per node over the target vocabulary ([N, V]); None means each
    # node is a point mass on its token (model-free drafters, greedy top-k heads).
    draft_probs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("DraftTree needs one parent per token")
        for i, p in enumerate(self.parents):
            if not 0 <= p <= i:
                raise ValueError(f"node {i + 1} has parent {p}; parents must precede children")

    @classmethod
    def chain(cls, tokens: list[int], draft_probs: torch.Tensor | None = None) -> DraftTree:
        return cls(list(tokens), list(range(len(tokens))), draft_probs)

    def along(self, path: list[int]) -> DraftTree:
        """The chain of this tree's nodes on `path` (node indices, root first)."""
        return DraftTree.chain([self.tokens[i - 1] for i in path[1:]])

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(p == i for i, p in enumerate(self.parents))

    def depths(self) -> list[int]:
        """Depth of every node, root included (root = 0)."""
        depth = [0]
        for p in self.parents:
            depth.append(depth[p] + 1)
        return depth

    def children(self) -> list[list[int]]:
        """Children of every node (root included), in node order."""
        kids: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for i, p in enumerate(self.parents):
            kids[p].append(i + 1)
        return kids

    def ancestor_mask(self) -> torch.Tensor:
        """[N+1, N+1] bool: row i may attend column j iff j is i or an ancestor of i (root included)."""
        n = len(self.tokens) + 1
        mask = torch.eye(n, dtype=torch.bool)
        for i, p in enumerate(self.parents, start=1):
            mask[i] |= mask[p]
        return mask

    def matched(self, continuation: list[int]) -> int:
        """Draft tokens a greedy verify would accept if the target's next tokens are `continuation`
        (the walk `accept_greedy` makes, with the trace in place of the target's argmax)."""
        children, node, n = self.children(), 0, 0
        while n < len(continuation):
            node = next((c for c in children[node] if self.tokens[c - 1] == continuation[n]), None)
            if node is None:
                break
            n += 1
        return n
