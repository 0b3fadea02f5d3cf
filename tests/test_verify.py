"""Tree verification and KV compaction agree with plain forwards over the same sequences."""

from __future__ import annotations

import random

import torch

from specbench_cli.core.target import Target
from specbench_cli.core.tree import DraftTree
from tests.helpers import random_prompt


def plain_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def random_tree(rng: random.Random, n: int, vocab: int) -> DraftTree:
    parents = [rng.randint(0, i) for i in range(n)]
    return DraftTree([rng.randrange(vocab) for _ in range(n)], parents)


def path_to(tree: DraftTree, node: int) -> list[int]:
    path = []
    while node:
        path.append(node)
        node = tree.parents[node - 1]
    return [0, *reversed(path)]


def test_tree_logits_equal_plain_forward_on_each_path(tiny):
    rng = random.Random(0)
    prompt = random_prompt(30)
    target = Target(tiny, torch.device("cpu"))
    target.prefill(prompt[:-1])
    tree = random_tree(rng, 12, 96)
    logits = target.verify(prompt[-1], tree)
    for node in range(len(tree) + 1):
        seq = prompt + [tree.tokens[i - 1] for i in path_to(tree, node)[1:]]
        torch.testing.assert_close(logits[node], plain_logits(tiny, seq), atol=1e-4, rtol=1e-4)


def test_commit_keeps_exactly_the_accepted_path(tiny):
    """After compaction to a non-prefix path, the next forward matches a plain forward over the sequence."""
    rng = random.Random(1)
    prompt = random_prompt(25)
    target = Target(tiny, torch.device("cpu"))
    target.prefill(prompt[:-1])
    seq = list(prompt)
    for _ in range(4):
        tree = random_tree(rng, 10, 96)
        target.verify(seq[-1], tree)
        leaf = max(range(1, len(tree) + 1), key=lambda i: (len(path_to(tree, i)), i))
        path = path_to(tree, leaf)
        target.commit(path)
        seq += [tree.tokens[i - 1] for i in path[1:]]
        assert target.length == len(seq)  # root and accepted nodes are cached
        seq.append(rng.randrange(96))  # the bonus token: next round's root, not cached yet
    logits = target.verify(seq[-1], DraftTree())
    torch.testing.assert_close(logits[0], plain_logits(tiny, seq), atol=1e-4, rtol=1e-4)


def test_chain_and_tree_masks_agree(tiny):
    """A chain verified through the tree-mask path gives the causal path's logits."""
    prompt = random_prompt(20)
    chain = DraftTree.chain([5, 9, 11, 4])
    a = Target(tiny, torch.device("cpu"))
    a.prefill(prompt[:-1])
    causal = a.verify(prompt[-1], chain)
    b = Target(tiny, torch.device("cpu"))
    b.prefill(prompt[:-1])
    masked = b.model(input_ids=torch.tensor([[prompt[-1], *chain.tokens]]),
                     position_ids=(b.length + torch.arange(5))[None], attention_mask=b._mask(chain.ancestor_mask()),
                     past_key_values=b.cache, use_cache=True).logits[0]
    torch.testing.assert_close(causal, masked.detach(), atol=1e-4, rtol=1e-4)
