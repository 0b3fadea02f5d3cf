"""DraftTree: what every proposer returns. A chain is a tree whose parents are 0, 1, 2, ...

Node indices are 1..N; index 0 is the root, the last committed token, which the verify forward feeds
first because its KV entry is not in the cache yet. `parents[i]` is the parent of node i+1 (0 = root),
and parents always come before their children.

A drafter whose tree is still on the device hands it over as it is: its tokens as a tensor, and its parents as a
tensor too where the device chose them (a tree search's top nodes). The verify builds its rows from there (`ids`,
`mask`, `positions`), and acceptance reads the tree with the target's own tokens, in the round's one read of the
device (`read`). Reading `tokens` or `parents` before that reads the tree on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from specbench_cli.core.host_copy import to_device, to_host


class DraftTree:
    def __init__(self, tokens: Sequence[int] | torch.Tensor = (), parents: Sequence[int] | torch.Tensor = (),
                 draft_probs: torch.Tensor | None = None) -> None:
        # node i+1's token and parent (0 = root): on the host (lists), or on the device until read (tensors)
        self._tokens, self._token_ids = _split(tokens)
        self._parents, self._parent_ids = _split(parents)
        self._device_mask: torch.Tensor | None = None  # `mask()` built on the device, kept for the round's other users
        # Optional draft distributions, one row per node over the target vocabulary ([N, V]); None means each
        # node is a point mass on its token (model-free drafters, greedy top-k heads).
        self.draft_probs = draft_probs
        if _count(tokens) != _count(parents):
            raise ValueError("DraftTree needs one parent per token")
        for i, p in enumerate(self._parents or ()):
            if not 0 <= p <= i:
                raise ValueError(f"node {i + 1} has parent {p}; parents must precede children")

    @classmethod
    def chain(cls, tokens: Sequence[int] | torch.Tensor, draft_probs: torch.Tensor | None = None) -> DraftTree:
        return cls(tokens, range(_count(tokens)), draft_probs)

    def __len__(self) -> int:
        return _count(self._parents if self._parent_ids is None else self._parent_ids)

    # ------------------------------------------------------------------------------------ on the host
    @property
    def tokens(self) -> list[int]:
        """Node i+1's token (read from the device on first use when the drafter left it there)."""
        if self._tokens is None:
            self.read()
        return self._tokens

    @property
    def parents(self) -> list[int]:
        """Node i+1's parent index, 0 = root (read from the device on first use when the drafter left it there)."""
        if self._parents is None:
            self.read()
        return self._parents

    def read(self, *values: torch.Tensor) -> list[torch.Tensor]:
        """`values` on the host, with whatever of this tree is still on the device: one read."""
        return read_trees([self], list(values))

    def _on_device(self) -> list[torch.Tensor]:
        return [t for t in (self._token_ids, self._parent_ids) if t is not None]

    def _took(self, host: list[torch.Tensor]) -> None:
        """The host copies of `_on_device()`, in its order."""
        copies = iter(host)
        if self._token_ids is not None:
            self._tokens, self._token_ids = next(copies).tolist(), None
        if self._parent_ids is not None:
            self._parents, self._parent_ids = next(copies).tolist(), None

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
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents):
            kids[p].append(i + 1)
        return kids

    def ancestor_mask(self) -> torch.Tensor:
        """[N+1, N+1] bool: row i may attend column j iff j is i or an ancestor of i (root included)."""
        n = len(self) + 1
        mask = torch.eye(n, dtype=torch.bool)
        for i, p in enumerate(self.parents, start=1):
            mask[i] |= mask[p]
        return mask

    def along(self, path: list[int]) -> DraftTree:
        """The chain of this tree's nodes on `path` (node indices, root first)."""
        return DraftTree.chain([self.tokens[i - 1] for i in path[1:]])

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

    # ------------------------------------------------------------------------------------ for the verify
    def ids(self, device: torch.device, root: int | None = None) -> torch.Tensor:
        """The tokens (after `root` if given) as a long tensor on `device`, without reading them on the host."""
        first = [] if root is None else [root]
        if self._token_ids is None:
            return to_device(first + self._tokens, device, torch.long)
        return torch.cat((to_device(first, device, torch.long), self._token_ids)) if first else self._token_ids

    def parent_ids(self, device: torch.device) -> torch.Tensor:
        """The parents as a long tensor on `device`, without reading them on the host."""
        return to_device(self._parents, device, torch.long) if self._parent_ids is None else self._parent_ids

    def mask(self) -> torch.Tensor:
        """`ancestor_mask()`, where the parents are: on the device, by pointer jumping (each step doubles the
        distance up the tree a row has reached; log2 N steps, no read), built once for the round's users (a method's
        side tokens, the verify's rows, the greedy walk's last node). Not to be written into."""
        if self._parent_ids is None:
            return self.ancestor_mask()
        if self._device_mask is None:
            self._device_mask = self._jumped_mask()
        return self._device_mask

    def _jumped_mask(self) -> torch.Tensor:
        n = len(self) + 1
        up = torch.cat((self._parent_ids.new_zeros(1), self._parent_ids))  # each node's parent, the root its own
        nodes = torch.arange(n, device=up.device)
        reach = torch.eye(n, dtype=torch.bool, device=up.device)
        reach[nodes, up] = True
        for _ in range(math.ceil(math.log2(n)) if n > 2 else 0):
            reach = reach | reach[up]
            up = up[up]
        return reach

    def positions(self, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Every node's depth (root = 0) as a long tensor, where the parents are (from the tree's `mask()`)."""
        if self._parent_ids is None:
            return torch.tensor(self.depths())
        return (self.mask() if mask is None else mask).sum(-1) - 1

    # ------------------------------------------------------------------------------------ comparing
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DraftTree):
            return NotImplemented
        same_probs = (self.draft_probs is None) == (other.draft_probs is None) and (
            self.draft_probs is None or torch.equal(self.draft_probs, other.draft_probs))
        return self.tokens == other.tokens and self.parents == other.parents and same_probs

    def __repr__(self) -> str:
        shown = [self._tokens, self._parents]
        return "DraftTree(tokens={}, parents={})".format(*("(on the device)" if s is None else s for s in shown))


def read_trees(trees: list[DraftTree], values: list[torch.Tensor]) -> list[torch.Tensor]:
    """`values` on the host, with whatever of `trees` is still on the device: one read for all of them (a round's
    sequences)."""
    pending = [tree._on_device() for tree in trees]
    flat = [*values, *(t for p in pending for t in p)]
    if not flat:
        return []
    host = to_host(*flat)
    rest = iter(host[len(values):])
    for tree, p in zip(trees, pending):
        tree._took([next(rest) for _ in p])
    return host[:len(values)]


def _split(values: Sequence[int] | torch.Tensor) -> tuple[list[int] | None, torch.Tensor | None]:
    """(host list, None) or (None, the device tensor, flat)."""
    if isinstance(values, torch.Tensor):
        return None, values.reshape(-1)
    return list(values), None


def _count(values: Sequence[int] | torch.Tensor) -> int:
    return values.numel() if isinstance(values, torch.Tensor) else len(values)
