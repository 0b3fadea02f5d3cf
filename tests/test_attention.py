"""`core.attention.exact_attention`: every row of a verify equals the one-token decode at its position, bit for bit.

The decode at position p reads its keys in slot order (the prefix, then the tokens decoded before it); a tree
node's ancestors sit elsewhere in a verify. These tests build, for each row of a random tree verify, the cache
that decode would see (its ancestors moved next to the prefix) and compare the two outputs exactly, on random
bf16-valued caches whose verifies straddle 64-key block boundaries (the places where rows fall into different
groups, or a deep node's ancestors reach back past its last block's start).
"""

from __future__ import annotations

import random

import pytest
import torch

from specbench_cli.core.attention import TAIL, decode_orders, exact_attention, rows_agree
from specbench_cli.core.tree import DraftTree
from tests.test_verify import path_to

KV_HEADS, GROUP, D, CAPACITY = 3, 3, 64, 512


def deep_tree(rng: random.Random, n: int) -> DraftTree:
    """Each node's parent among the last few nodes: deep paths that branch (depth ~ n / 2)."""
    return DraftTree([rng.randrange(100) for _ in range(n)], [rng.randint(max(0, i - 2), i) for i in range(n)])


def verify_mask(tree: DraftTree, base: int) -> torch.Tensor:
    """[1, 1, R, CAPACITY]: the prefix [0, base) and each row's ancestors and itself at slots base + node."""
    rows = len(tree) + 1
    mask = torch.zeros(1, 1, rows, CAPACITY, dtype=torch.bool)
    mask[..., :base] = True
    mask[0, 0, :, base:base + rows] = tree.ancestor_mask()
    return mask


def attend(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, base: int, one_call: bool) -> torch.Tensor:
    rows = mask.shape[2]
    order = decode_orders(mask, torch.zeros(1, rows, dtype=torch.bool), torch.arange(base, base + rows)[None], 0)[0]
    return exact_attention(q, kv[0], kv[1], order, 0.125, one_call)


def decoded(q_row: torch.Tensor, kv: torch.Tensor, base: int, path: list[int]) -> torch.Tensor:
    """The one-token decode of the row whose path (node indices, root first) is `path`: its keys at slots
    base, base + 1, ... in path order, itself last."""
    laid = kv.clone()
    laid[:, :, base:base + len(path)] = kv[:, :, [base + node for node in path]]
    mask = torch.zeros(1, 1, 1, CAPACITY, dtype=torch.bool)
    mask[..., :base + len(path)] = True
    p = base + len(path) - 1
    return attend(q_row, laid, mask, p, True)


@pytest.mark.parametrize("base", [61, 63, 64, 100, 190])
def test_every_tree_row_equals_its_decode(base):
    torch.manual_seed(base)
    rng = random.Random(base)
    tree = deep_tree(rng, 24)
    rows = len(tree) + 1
    kv = torch.randn(2, KV_HEADS, CAPACITY, D).bfloat16().float()
    q = torch.randn(1, KV_HEADS * GROUP, rows, D).bfloat16()
    mask = verify_mask(tree, base)
    together = attend(q, kv, mask, base, rows_agree())
    one_by_one = attend(q, kv, mask, base, False)
    assert torch.equal(together, one_by_one)
    for node in range(rows):
        decode = decoded(q[:, :, node:node + 1], kv, base, path_to(tree, node))
        assert torch.equal(together[:, :, node:node + 1], decode), f"row {node} at base {base}"


def test_rows_are_grouped_by_where_their_last_block_starts():
    """A chain across a block boundary: two groups of rows in slot order (no gathered keys); a deep tree node
    whose ancestors reach back past its last block's start: a group of its own with its keys gathered."""
    chain = DraftTree.chain(list(range(5)))
    order = decode_orders(verify_mask(chain, 62), torch.zeros(1, 6, dtype=torch.bool), torch.arange(62, 68)[None], 0)[0]
    assert [g.rows.tolist() for g in order.groups] == [[0, 1], [2, 3, 4, 5]]
    assert all(g.tail is None for g in order.groups)
    assert [g.head for g in order.groups] == [(0, 0), (0, 64)]
    assert order.end == 64 + TAIL  # the second group reads its whole last block, masked past each row
    # root -> a, root -> b -> c -> d: b, c, d sit after a's slot, so c and d (past slot 64) are on their own
    tree = DraftTree([1, 2, 3, 4], [0, 0, 2, 3])
    order = decode_orders(verify_mask(tree, 62), torch.zeros(1, 5, dtype=torch.bool), torch.arange(62, 67)[None], 0)[0]
    alone = [g for g in order.groups if not isinstance(g.head, tuple)]
    assert sorted(int(g.rows[0]) for g in alone) == [3, 4]
    assert alone[0].head.tolist()[-2:] == [62, 64]  # the root and b (at slot 64), not slot 63 (a)


def test_cudnn_leaves_sdpa_unless_the_environment_keeps_it(monkeypatch):
    """CUDA runs leave cuDNN's attention out of SDPA (a plan per new key span; core.attention), unless asked."""
    from specbench_cli.core.attention import cudnn_sdpa, leave_cudnn_out_of_sdpa

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        monkeypatch.delenv("SPECBENCH_SDPA_CUDNN", raising=False)
        assert not cudnn_sdpa()
        leave_cudnn_out_of_sdpa(not cudnn_sdpa())
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setenv("SPECBENCH_SDPA_CUDNN", "1")
        assert cudnn_sdpa()
        leave_cudnn_out_of_sdpa(not cudnn_sdpa())
        assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
