"""Temperature > 0: chain and tree speculative sampling reproduce the target's distribution.

A synthetic target (next-token logits a fixed function of the context) is decoded round by round with the
real acceptance code; the frequencies of the first three emitted tokens are compared with the exact
distribution by a chi-square test."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from specbench_cli.core.acceptance import accept, greedy_tokens
from specbench_cli.core.tree import DraftTree
from tests.helpers import chi_square_p

V = 4
T = 0.8


def target_logits(context: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash(context[-2:]) % (2**31))
    return torch.randn(V, generator=g) * 1.5


def exact_probs() -> dict[tuple[int, ...], float]:
    out = {}
    for seq in itertools.product(range(V), repeat=3):
        p, ctx = 1.0, (0,)
        for t in seq:
            p *= float(torch.softmax(target_logits(ctx) / T, -1)[t])
            ctx += (t,)
        out[seq] = p
    return out


def draft(rng: random.Random, kind: str) -> DraftTree:
    if kind == "chain":
        return DraftTree.chain([rng.randrange(V) for _ in range(3)])
    if kind == "tree":  # two siblings at the root, two under the first, one under the second
        return DraftTree([rng.randrange(V) for _ in range(5)], [0, 0, 1, 1, 2])
    # chain with full draft distributions, drawn from them
    # Its own generator: drafts drawn from the global RNG could replay the acceptance uniforms (same seed).
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    q = torch.softmax(torch.randn(3, V, generator=g), -1)
    return DraftTree.chain([int(torch.multinomial(q[i], 1, generator=g)) for i in range(3)], draft_probs=q)


def sample_three(rng: random.Random, gen: torch.Generator, kind: str) -> tuple[int, ...]:
    ctx = (0,)
    while len(ctx) < 4:
        tree = draft(rng, kind)
        paths = {0: ctx}
        for i, p in enumerate(tree.parents, start=1):
            paths[i] = paths[p] + (tree.tokens[i - 1],)
        logits = torch.stack([target_logits(paths[i]) for i in range(len(tree) + 1)])
        ctx += tuple(accept(tree, logits, T, gen).tokens)
    return ctx[1:4]


def chi_square_table(observed: dict, expected: dict, n: int) -> float:
    return chi_square_p([observed.get(k, 0) for k in expected], [n * p for p in expected.values()])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["chain", "tree", "chain-with-q"])
def test_speculative_sampling_matches_target_distribution(kind):
    rng, gen, n = random.Random(0), torch.Generator().manual_seed(0), 6000
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n):
        key = sample_three(rng, gen, kind)
        counts[key] = counts.get(key, 0) + 1
    assert chi_square_table(counts, exact_probs(), n) > 1e-3


def test_the_chi_square_check_can_fail():
    """Guard: a biased sampler (always accept the draft) is rejected by the same check."""
    rng, n = random.Random(0), 3000
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n):
        key = tuple(rng.randrange(V) for _ in range(3))
        counts[key] = counts.get(key, 0) + 1
    assert chi_square_table(counts, exact_probs(), n) < 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_greedy_tokens_are_argmax_first_maximum(dtype):
    """Greedy acceptance reads the first maximal index, as torch.argmax defines it, ties included (bf16 logits
    tie often)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randint(-3, 4, (9, 300), generator=g).to(dtype)
        assert torch.equal(greedy_tokens(logits), logits.argmax(-1))
