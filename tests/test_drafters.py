"""suffix and pld drafts against straightforward reference implementations of their papers' rules."""

from __future__ import annotations

import random

import pytest

from specbench_methods.pld import lookup
from specbench_methods.suffix import SpecParams, TokenStore, speculate


class Trie:
    """The reference's data structure, uncompressed: every suffix (cut at max_depth) counted node by node, each
    node's children in a list kept as ArcticInference's suffix_tree.cc keeps its sibling list: sorted by count, a
    new child at the tail, a child whose count grows from c filed after every child of count c + 1 (at the tail
    of those) unless it led the children of count c, in which case it leads those of count c + 1. (Per node the
    occurrences arrive here in the order the reference appends them: by position within a sequence, sequences in
    order.)"""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root: dict = self._node()

    @staticmethod
    def _node() -> dict:
        return {"count": 0, "kids": {}, "order": []}

    def add(self, seq: list[int]) -> None:
        for start in range(len(seq)):
            node = self.root
            node["count"] += 1
            for tok in seq[start:start + self.max_depth]:
                node = self._bump(node, tok)

    def _bump(self, node: dict, tok: int) -> dict:
        kids, order = node["kids"], node["order"]
        if tok not in kids:
            kids[tok] = self._node()
            order.append(tok)
        else:
            c, i = kids[tok]["count"], order.index(tok)
            if i > 0 and kids[order[i - 1]]["count"] in (c, c + 1):
                led = kids[order[i - 1]]["count"] == c + 1  # the one before it has the next count up
                order.pop(i)
                # led: to the head of the count-(c+1) children; else to their tail (before the count-c ones)
                below = c + 1 if led else c
                order.insert(next(j for j, t in enumerate(order) if kids[t]["count"] <= below), tok)
        kids[tok]["count"] += 1
        return kids[tok]

    def speculate_path(self, pattern: list[int], p: SpecParams) -> tuple[list[int], list[float], int]:
        pattern = pattern[-p.max_depth:]
        best = ([], [], 0)
        for m in range(1, len(pattern)):
            node = self.root
            for tok in pattern[-m:]:
                node = node["kids"].get(tok)
                if node is None:
                    return best
            tokens, probs, prob = [], [], 1.0
            while len(tokens) < p.cap(m) and node["kids"]:
                tok = node["order"][0]
                kid = node["kids"][tok]
                prob *= kid["count"] / node["count"]
                if prob < p.min_token_prob:
                    break
                tokens.append(tok)
                probs.append(prob)
                node = kid
            if sum(probs) >= sum(best[1]):
                best = (tokens, probs, m)
        return best


@pytest.mark.parametrize("seed", range(6))
def test_suffix_path_draft_matches_an_explicit_suffix_tree(seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 12])
    seqs = [[rng.randrange(vocab) for _ in range(rng.randint(5, 80))] for _ in range(3)]
    params = SpecParams(max_depth=rng.choice([8, 64]), tree=False)
    trie, store = Trie(params.max_depth), TokenStore()
    for s in seqs:
        trie.add(s)
        store.new_sequence()
        store.extend(s)
    for _ in range(10):
        pattern = seqs[-1][: rng.randint(2, len(seqs[-1]))]
        tokens, probs, m = trie.speculate_path(pattern, params)
        draft = speculate(store, pattern, params)
        assert draft.tokens == tokens
        assert draft.probs == pytest.approx(probs)
        assert draft.match_len == m or not tokens


def test_equally_frequent_continuations_go_as_in_arcticinference():
    """Cases worked by hand from the reference's sibling list (suffix_tree.cc); tests/test_engine_vllm.py compares
    whole drafts with ArcticInference's own cache where it is installed."""
    from specbench_methods.suffix import sibling_order

    assert sibling_order([9, 7]) == [9, 7]  # [5, 9, 5, 7] then "5": 9 arrived first, so 9 is drafted
    store = TokenStore()
    store.new_sequence()
    store.extend([5, 9, 5, 7, 3])
    assert speculate(store, [1, 5], SpecParams(tree=False, min_token_prob=0.0)).tokens[0] == 9
    # root children appended 1, 2, 3, 3, 2, 1: 3 leads its group when it reaches 2, so it leads the 2s; 2 then
    # follows it (it was inside the 1s), and 1, which led the 1s, moves to the head of the 2s
    assert sibling_order([1, 2, 3, 3, 2, 1]) == [1, 3, 2]
    assert sibling_order([4, 4, 6, 5, 5]) == [4, 5, 6]


def test_suffix_tree_draft_is_best_first():
    store = TokenStore()
    for seq in ([7, 8, 9, 1, 2, 3, 4, 6], [7, 8, 9, 1, 2, 3, 5, 7], [7, 8, 9, 1, 2, 3, 4, 6]):
        store.new_sequence()
        store.extend(seq)
    tree = speculate(store, [7, 8, 9, 1, 2], SpecParams())
    # "8 9 1 2" occurs 3 times (cap 4 tokens): 3 (p=1), then 4 (2/3) and 6 (2/3) before the sibling 5 (1/3)
    assert (tree.tokens, tree.parents, tree.match_len) == ([3, 4, 6, 5], [-1, 0, 1, 0], 4)
    assert tree.probs == pytest.approx([1, 2 / 3, 2 / 3, 1 / 3])
    path = speculate(store, [7, 8, 9, 1, 2], SpecParams(tree=False))
    assert path.tokens == [3, 4, 6] and tree.score > path.score


def reference_pld(seq: list[int], max_ngram: int = 3, num_pred: int = 10) -> list[int]:
    """apoorvumang/prompt-lookup-decoding's find_candidate_pred_tokens, in plain Python."""
    n_total = len(seq)
    for n in range(max_ngram, 0, -1):
        ngram = seq[-n:]
        for i in range(n_total - n + 1):
            if seq[i:i + n] == ngram:
                start, end = i + n, i + n + num_pred
                if end <= n_total and start < n_total - n:
                    return seq[start:end]
    return []


@pytest.mark.parametrize("seed", range(20))
def test_pld_matches_the_reference(seed):
    rng = random.Random(seed)
    seq = [rng.randrange(rng.choice([3, 6, 20])) for _ in range(rng.randint(2, 60))]
    assert lookup(seq, 3, 1, 10) == reference_pld(seq)
