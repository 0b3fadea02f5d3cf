"""The n-gram trie DART scores draft continuations with, in the released binary `.trie` format.

Format (fvliang/DART `cpplib/cpp_ngram/trie_ngram.cpp`, native little-endian, no padding): header
order (uint64), node_count (uint64); then per node in id order: token int32, parent uint64, freq int32,
children_count uint64, and children_count pairs (child_token int32, child_id uint64). Node 0 is the root.

Building: every start position of every sequence inserts the slice of at most `order` tokens; each node
on the way (root included) and the end node get freq + 1, so freq(u) = number of slices with u's path as
a prefix. Probability of token t after a context: for context suffixes from the longest (order − 1)
down to 1 that exist in the trie, a token not yet scored gets freq(child) / freq(context node); tokens
never matched get 0 (no unigram back-off).

In memory the trie is a few numpy arrays in CSR form (children sorted by token), not a dict per node, so
the released multi-million-node tries fit and lookups are vectorised over the candidate tokens.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specbench_methods.checkpoints import CheckpointError

HEADER = struct.Struct("<QQ")
NODE = struct.Struct("<iQiQ")
CHILD = np.dtype([("token", "<i4"), ("id", "<u8")])


@dataclass
class Trie:
    order: int
    token: np.ndarray  # int32 [N]
    parent: np.ndarray  # int64 [N]
    freq: np.ndarray  # int64 [N]
    child_start: np.ndarray  # int64 [N + 1]; children of u are child_token/child_id[start[u]:start[u+1]]
    child_token: np.ndarray  # int32 [E], sorted within each node
    child_id: np.ndarray  # int64 [E]

    # ------------------------------------------------------------------------------------ queries
    def child(self, node: int, token: int) -> int:
        s, e = self.child_start[node], self.child_start[node + 1]
        i = s + np.searchsorted(self.child_token[s:e], token)
        return int(self.child_id[i]) if i < e and self.child_token[i] == token else -1

    def find(self, path: list[int]) -> int:
        node = 0
        for t in path:
            node = self.child(node, t)
            if node < 0:
                return -1
        return node

    def probability(self, context: list[int], tokens: np.ndarray) -> np.ndarray:
        """P(each token | context) as the reference computes it (longest matching context first)."""
        probs = np.zeros(len(tokens), dtype=np.float64)
        scored = np.zeros(len(tokens), dtype=bool)
        for length in range(min(self.order - 1, len(context)), 0, -1):
            node = self.find(context[len(context) - length:])
            if node < 0:
                continue
            s, e = self.child_start[node], self.child_start[node + 1]
            pos = s + np.searchsorted(self.child_token[s:e], tokens)
            hit = (pos < e) & ~scored
            hit[hit] &= self.child_token[pos[hit]] == tokens[hit]
            probs[hit] = self.freq[self.child_id[pos[hit]]] / self.freq[node]
            scored |= hit
        return probs

    # ------------------------------------------------------------------------------------ building
    @classmethod
    def build(cls, sequences: list[list[int]], order: int = 3) -> Trie:
        """Insert every slice of at most `order` tokens of every sequence (callers append EOS as DART does)."""
        children: list[dict[int, int]] = [{}]
        token, parent, freq = [0], [0], [0]
        for seq in sequences:
            for start in range(len(seq)):
                node = 0
                for t in seq[start:start + order]:
                    freq[node] += 1
                    nxt = children[node].get(t)
                    if nxt is None:
                        nxt = len(token)
                        children[node][t] = nxt
                        children.append({})
                        token.append(t)
                        parent.append(node)
                        freq.append(0)
                    node = nxt
                freq[node] += 1
        return cls._from_lists(order, token, parent, freq, children)

    @classmethod
    def _from_lists(cls, order, token, parent, freq, children) -> Trie:
        counts = np.array([len(c) for c in children], dtype=np.int64)
        start = np.concatenate(([0], np.cumsum(counts)))
        pairs = [sorted(c.items()) for c in children]
        flat = [p for node in pairs for p in node]
        child_token = np.array([t for t, _ in flat], dtype=np.int32)
        child_id = np.array([i for _, i in flat], dtype=np.int64)
        return cls(order, np.array(token, dtype=np.int32), np.array(parent, dtype=np.int64),
                   np.array(freq, dtype=np.int64), start, child_token, child_id)

    # ------------------------------------------------------------------------------------ files
    def save(self, path: Path) -> None:
        with open(path, "wb") as f:
            f.write(HEADER.pack(self.order, len(self.token)))
            for u in range(len(self.token)):
                s, e = int(self.child_start[u]), int(self.child_start[u + 1])
                f.write(NODE.pack(int(self.token[u]), int(self.parent[u]), int(self.freq[u]), e - s))
                kids = np.empty(e - s, dtype=CHILD)
                kids["token"], kids["id"] = self.child_token[s:e], self.child_id[s:e]
                f.write(kids.tobytes())

    @classmethod
    def load(cls, path: Path) -> Trie:
        """Parse the variable-length records one after another (the format has no index)."""
        data = memoryview(Path(path).read_bytes())
        if len(data) < HEADER.size:
            raise CheckpointError(f"{path}: too short for a .trie file")
        order, n = HEADER.unpack_from(data, 0)
        if not 1 <= order <= 16 or n == 0:
            raise CheckpointError(f"{path}: not a .trie file (order {order}, {n} nodes)")
        token = np.empty(n, np.int32)
        parent = np.empty(n, np.int64)
        freq = np.empty(n, np.int64)
        start = np.zeros(n + 1, np.int64)
        child_chunks, offset = [], HEADER.size
        try:
            for u in range(n):
                token[u], parent[u], freq[u], count = NODE.unpack_from(data, offset)
                offset += NODE.size
                start[u + 1] = start[u] + count
                if count:
                    child_chunks.append(np.frombuffer(data, CHILD, count, offset))
                    offset += count * CHILD.itemsize
        except (struct.error, ValueError):
            raise CheckpointError(f"{path}: truncated .trie file (node {u} of {n})") from None
        kids = np.concatenate(child_chunks) if child_chunks else np.empty(0, CHILD)
        # sort children by token inside each node (the writer's order is a hash map's)
        owner = np.repeat(np.arange(n), np.diff(start))
        order_idx = np.lexsort((kids["token"], owner))
        kids = kids[order_idx]
        return cls(int(order), token, parent, freq, start, kids["token"].astype(np.int32), kids["id"].astype(np.int64))
