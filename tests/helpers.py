"""Test drafters and small utilities shared by the tests."""

from __future__ import annotations

import random

import torch

from methods.base import DecodeState, Method
from specbench_cli.engine import DecodeSettings, TurnResult, decode_turn
from specbench_cli.target import Target
from specbench_cli.tree import DraftTree


class OracleTree(Method):
    """Drafts random trees that contain a correct branch of random length (taken from a known reference
    output) at a random sibling position, plus wrong siblings and wrong sub-branches. Accepts often and
    makes the accepted path a non-prefix of the node order, which exercises tree masks and KV compaction."""

    name = "oracle-tree"

    def __init__(self, reference: list[int], vocab: int, seed: int = 0, chain: bool = False) -> None:
        super().__init__(Method.Options(), None)
        self.reference, self.vocab, self.chain = reference, vocab, chain
        self.rng = random.Random(seed)

    def propose(self, state: DecodeState) -> DraftTree:
        done = len(state.tokens) - state.prompt_len  # output tokens so far
        truth = self.reference[done:done + self.rng.randint(0, 6)]
        if self.chain:  # the right prefix, then a wrong tail
            return DraftTree.chain(truth + [self.rng.randrange(self.vocab) for _ in range(self.rng.randint(0, 3))])
        tokens, parents, parent = [], [], 0
        for tok in truth:
            wrong = [self.rng.randrange(self.vocab) for _ in range(self.rng.randint(0, 2))]
            slot = self.rng.randint(0, len(wrong))
            for k, t in enumerate(wrong[:slot] + [tok] + wrong[slot:]):
                tokens.append(t)
                parents.append(parent)
                if k == slot:
                    right = len(tokens)
            for _ in range(self.rng.randint(0, 2)):  # a wrong grandchild under some sibling
                tokens.append(self.rng.randrange(self.vocab))
                parents.append(self.rng.randint(parent + 1, len(tokens) - 1) if len(tokens) > parent + 1 else parent)
            parent = right
        return DraftTree(tokens, parents)


def run_method(model: torch.nn.Module, method: Method, prompt: list[int], max_new: int = 120,
               stops: frozenset[int] = frozenset(), temperature: float = 0.0) -> TurnResult:
    target = Target(model, torch.device("cpu"))
    return decode_turn(target, method, prompt, DecodeSettings(max_new, temperature, stops))


def random_prompt(n: int = 40, vocab: int = 96, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()
