"""Test drafters and small utilities shared by the tests."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile

import torch

from specbench_cli.core.method import DecodeState, Method
from specbench_cli.core.engine import decode_turn
from specbench_cli.core.turn import DecodeSettings, TurnResult
from specbench_cli.core.target import Target
from specbench_cli.core.tree import DraftTree


class OracleTree(Method):
    """Drafts random trees that contain a correct branch of random length (taken from a known reference
    output) at a random sibling position, plus wrong siblings and wrong sub-branches. Accepts often and
    makes the accepted path a non-prefix of the node order, which exercises tree masks and KV compaction."""

    name = "oracle-tree"

    def __init__(self, reference: list[int], vocab: int, seed: int = 0, chain: bool = False) -> None:
        super().__init__(Method.Options(), None)
        self.reference, self.vocab, self.chain = reference, vocab, chain
        self.rng = random.Random(seed)

    def propose_one(self, state: DecodeState) -> DraftTree:
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


def tree_opts(total: int, depth: int, top_k: int, method: str = "") -> list[str]:
    """`run`'s --opt arguments for an EAGLE-3-style tree (total_token, depth, top_k), small enough for CI's CPU;
    `method` prefixes each (a list member or a routed method's proposer: "confu", "eagle3")."""
    prefix = f"{method}." if method else ""
    return [arg for key, value in (("total_token", total), ("depth", depth), ("top_k", top_k))
            for arg in ("--opt", f"{prefix}{key}={value}")]


def run_method(model: torch.nn.Module, method: Method, prompt: list[int], max_new: int = 120,
               stops: frozenset[int] = frozenset(), temperature: float = 0.0, target: Target | None = None) -> TurnResult:
    """Decode one turn; `target` (e.g. a compiled one) replaces a fresh eager Target over `model`."""
    target = target or Target(model, torch.device("cpu"))
    return decode_turn(target, method, prompt, DecodeSettings(max_new, temperature, stops))


def random_prompt(n: int = 40, vocab: int = 96, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


@torch.no_grad()
def exact_distribution(model: torch.nn.Module, prompt: list[int], temperature: float, length: int,
                       floor: float = 1e-3) -> dict[tuple[int, ...], float]:
    """P(first `length` sampled tokens) under the target at `temperature`, for sequences above `floor`."""
    out: dict[tuple[int, ...], float] = {}
    frontier = [((), 1.0)]
    for _ in range(length):
        grown = []
        for seq, p in frontier:
            logits = model(torch.tensor([prompt + list(seq)])).logits[0, -1]
            probs = torch.softmax(logits / temperature, -1)
            grown += [(seq + (t,), p * float(q)) for t, q in enumerate(probs.tolist()) if p * q > floor]
        frontier = grown
    out.update(frontier)
    return out


def sampling_p_value(model: torch.nn.Module, make_method, prompt: list[int], temperature: float = 0.06,
                     n: int = 600, length: int = 3) -> float:
    """Chi-square p-value of the method's first `length` sampled tokens against the target's distribution.

    Tiny random targets have nearly flat logits, so a low temperature (0.06) gives a distribution with a
    few likely sequences (top token ~0.5-0.9) in which drafts are accepted and rejected often. Cells
    expected fewer than 5 times are pooled into one."""
    exact = exact_distribution(model, prompt, temperature, length)
    counts: dict[tuple[int, ...], int] = {}
    target = Target(model, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    method = make_method()
    for _ in range(n):
        out = decode_turn(target, method, prompt, DecodeSettings(length, temperature, frozenset()), gen).output_ids
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    big = {k: p for k, p in exact.items() if n * p >= 5}
    rest = 1.0 - sum(big.values())
    observed = [counts.get(k, 0) for k in big] + [n - sum(counts.get(k, 0) for k in big)]
    expected = [n * p for p in big.values()] + [n * rest]
    return chi_square_p(observed, expected)


def chi_square_p(observed: list[float], expected: list[float]) -> float:
    """Pearson's chi-square test: the probability of a statistic this large if the counts follow `expected`."""
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected) if e > 0)
    dof = sum(1 for e in expected if e > 0) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))


def baseline_output(model: torch.nn.Module, prompt: list[int], max_new: int = 150, invariant: bool = False) -> list[int]:
    from specbench_methods.baseline import Baseline

    target = Target(model, torch.device("cpu"), invariant=invariant)
    return run_method(model, Baseline(Baseline.Options(), None), prompt, max_new=max_new, target=target).output_ids


def assert_lossless(model: torch.nn.Module, method: Method, prompt: list[int], max_new: int = 150,
                    min_accepted: int = 1, target: Target | None = None) -> TurnResult:
    """The method's greedy output equals the (eager) baseline's, and it accepted at least `min_accepted` drafts
    (a batch-invariant `target` is compared with a batch-invariant baseline)."""
    result = run_method(model, method, prompt, max_new=max_new, target=target)
    assert result.output_ids == baseline_output(model, prompt, max_new, invariant=bool(target and target.invariant))
    accepted = sum(r.accepted for r in result.rounds)
    assert accepted >= min_accepted, f"only {accepted} draft tokens accepted: the acceptance path barely ran"
    return result


def assert_multi_turn_lossless(model: torch.nn.Module, method: Method, prompt: list[int]) -> None:
    """Turn 2's prompt holds turn 1's answer plus new user tokens; the method must start over cleanly."""
    first = assert_lossless(model, method, prompt, max_new=60)
    second = prompt + first.output_ids + random_prompt(8, seed=9)
    assert_lossless(model, method, second, max_new=80)


class Background:
    """A `specbench` command in a process of its own, beside what the test does meanwhile: the engine fixtures
    run our engine's list (one thread) while vLLM's engines, one thread each and one busy at a time, boot and
    decode, so that the machine's second core works too. `wait()` asserts it succeeded."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.output = tempfile.TemporaryFile("w+")  # not a pipe: a full one would stall the command
        self.process = subprocess.Popen([sys.executable, "-m", "specbench_cli.cli", *args], stdout=self.output,
                                        stderr=subprocess.STDOUT, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})

    def wait(self) -> None:
        self.process.wait(timeout=1800)
        self.output.seek(0)
        assert self.process.returncode == 0, f"specbench {' '.join(self.args)}:\n{self.output.read()[-4000:]}"
