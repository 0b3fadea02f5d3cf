"""Tree verification and KV compaction agree with plain forwards over the same sequences."""

from __future__ import annotations

import random

import pytest
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


def test_a_tree_left_on_the_device_builds_the_hosts_mask_and_depths_and_is_read_once():
    from specbench_cli.core.host_reads import HostReads

    rng = random.Random(3)
    for n in (0, 1, 2, 3, 7, 33, 60):
        for _ in range(5):
            tree = random_tree(rng, n, 1000)
            tree = tree if rng.random() < 0.7 else DraftTree.chain(tree.tokens)
            roots = [torch.tensor(tree.tokens, dtype=torch.long), torch.tensor(tree.parents, dtype=torch.long)]
            with HostReads(roots) as reads:  # a device tree: what a drafter's tensors would be
                pending = DraftTree(*roots)
                mask, positions = pending.mask(), pending.positions()
                assert reads.count == 0  # nothing read to build a verify's rows
                assert pending.mask() is mask  # built once for the round's users
                best = pending.read(roots[0] * 2)[0]
                assert reads.count == 1 and pending.tokens == tree.tokens and pending.parents == tree.parents
            assert torch.equal(mask, tree.ancestor_mask()) and positions.tolist() == tree.depths()
            assert best.tolist() == [2 * t for t in tree.tokens] and pending == tree


def test_the_greedy_walks_last_node_is_found_without_a_read():
    """`greedy_node` ends where the host's greedy walk ends, on host and device trees, chains and trees whose
    siblings repeat a token (three tokens: most parents' argmax has several matching children, and the walk takes
    the first), reading nothing; `accept_greedy_all` reads a value computed there with the tokens, in one read."""
    from specbench_cli.core.acceptance import accept_greedy, accept_greedy_all, greedy_node, greedy_tokens
    from specbench_cli.core.host_reads import HostReads

    rng = random.Random(5)
    deep = 0
    for n in (0, 1, 2, 5, 12, 40):
        for _ in range(30):
            tree = random_tree(rng, n, 3)
            tree = tree if rng.random() < 0.7 else DraftTree.chain(tree.tokens)
            logits = torch.nn.functional.one_hot(torch.tensor([rng.randrange(3) for _ in range(n + 1)]), 3).float()
            walked = accept_greedy(tree, logits).path
            roots = [torch.tensor(tree.tokens, dtype=torch.long), torch.tensor(tree.parents, dtype=torch.long), logits]
            with HostReads(roots) as reads:
                on_device = DraftTree(*roots[:2])
                nodes = [greedy_node(t, greedy_tokens(logits)) for t in (tree, on_device)]
                assert reads.count == 0, reads.sites
                (got,) = accept_greedy_all([on_device], [logits], [lambda node: node * 10])
                assert reads.count == 1, reads.sites
            assert [int(node) for node in nodes] == [walked[-1]] * 2, (tree, logits.argmax(-1))
            assert got.path == walked and got.ahead.tolist() == [10 * walked[-1]]
            deep += len(walked) > 2
    assert deep > 20  # walks that go past one draft token are common


def test_verify_of_a_tree_left_on_the_device_is_the_hosts(tiny):
    """The verify builds its rows from a device tree (tokens; parents too, or a chain's) without reading it, and
    computes exactly the host tree's logits; greedy acceptance then reads the tree with the target's tokens."""
    from specbench_cli.core.acceptance import accept_greedy
    from specbench_cli.core.host_reads import HostReads

    rng = random.Random(4)
    prompt = random_prompt(30)
    target = Target(tiny, torch.device("cpu"))
    for tree, chain in ((random_tree(rng, 12, 96), False), (DraftTree.chain(random_tree(rng, 6, 96).tokens), True)):
        target.prefill(prompt[:-1])
        expected = target.verify(prompt[-1], tree)
        target.prefill(prompt[:-1])
        tokens, parents = torch.tensor(tree.tokens), torch.tensor(tree.parents)
        with HostReads([*tiny.parameters(), tokens, parents]) as reads:  # the tree's tensors as a drafter's would be
            device_tree = DraftTree.chain(tokens) if chain else DraftTree(tokens, parents)
            logits = target.verify(prompt[-1], device_tree)
            before = reads.count
            got = accept_greedy(device_tree, logits)
        assert before == 0 and reads.count == 1, reads.sites
        assert torch.equal(logits, expected) and got == accept_greedy(tree, expected)


@pytest.mark.slow
def test_compiled_path_gives_the_eager_logits(tiny):
    """Padded to a bucket and attending over the whole buffer, a verify gives the eager verify's logits."""
    rng = random.Random(2)
    prompt = random_prompt(20)
    eager, padded = Target(tiny, torch.device("cpu")), Target(tiny, torch.device("cpu"), compile="aot_eager")
    for target in (eager, padded):
        target.prefill(prompt[:-1])
    for _ in range(3):
        tree = random_tree(rng, rng.randint(0, 12), 96)
        a, b = eager.verify(prompt[-1], tree), padded.verify(prompt[-1], tree)
        # the eager target's layers run packed GEMMs (core/kernels.py), the traced graph plain ones: float32 sums
        # in another order, as test_batch.py allows
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        path = [0, *([1] if len(tree) and tree.parents[0] == 0 else [])]
        eager.commit(path)
        padded.commit(path)
        prompt.append(rng.randrange(96))
    assert set(padded.compile_seconds) <= set(padded.buckets)


def test_unsupported_families_are_refused_in_one_line():
    from transformers import GPT2Config, GPT2LMHeadModel

    from specbench_cli.core.errors import UsageError

    with pytest.raises(UsageError, match="model type 'gpt2'"):
        Target(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)), torch.device("cpu"))
