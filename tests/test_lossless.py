"""Temperature 0: every method emits exactly the baseline's tokens, with drafts that really get accepted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specbench_cli.registry import method_class
from specbench_cli.options import parse_options
from specbench_methods.hf_generate import HFGenerate
from tests.helpers import OracleTree, random_prompt, run_method

MODEL_FREE = ["suffix", "pld"]


def make(name: str, *opts: str):
    cls = method_class(name)
    return cls(parse_options(cls, list(opts)), None)


@pytest.fixture(scope="module")
def reference(tiny):
    prompt = random_prompt(40)
    return prompt, run_method(tiny, make("baseline"), prompt, max_new=150)


@pytest.mark.parametrize("name,opts", [("suffix", ()), ("suffix", ("tree=false",)), ("pld", ())])
def test_model_free_methods_are_lossless_and_accept(tiny, reference, name, opts):
    prompt, base = reference
    result = run_method(tiny, make(name, *opts), prompt, max_new=150)
    assert result.output_ids == base.output_ids
    accepted = sum(r.accepted for r in result.rounds)
    assert accepted >= 50, f"{name} accepted only {accepted} draft tokens: the acceptance path barely ran"
    assert len(result.rounds) < len(base.rounds) / 2


def test_hf_generate_matches_baseline(tiny, reference):
    prompt, base = reference
    loaded = SimpleNamespace(model=tiny, device=torch.device("cpu"))
    result = run_method(tiny, HFGenerate(HFGenerate.Options(), loaded), prompt, max_new=150)
    assert result.output_ids == base.output_ids


@pytest.mark.parametrize("chain", [False, True])
def test_oracle_trees_and_chains_are_lossless(tiny, reference, chain):
    prompt, base = reference
    method = OracleTree(base.output_ids, 96, seed=3, chain=chain)
    result = run_method(tiny, method, prompt, max_new=150)
    assert result.output_ids == base.output_ids
    assert sum(r.accepted for r in result.rounds) >= 100
    if not chain:
        assert max(r.tree_size for r in result.rounds) > max(r.draft_depth for r in result.rounds)


def test_stop_token_inside_an_accepted_block_is_not_overshot(tiny, reference):
    """Pick a token from the middle of the reference as a stop: everything after it must be dropped."""
    prompt, base = reference
    stop = base.output_ids[60]
    first = base.output_ids.index(stop)
    expected = base.output_ids[: first + 1]
    for method in (make("suffix"), OracleTree(base.output_ids, 96, seed=5)):
        result = run_method(tiny, method, prompt, max_new=150, stops=frozenset({stop}))
        assert result.output_ids == expected
        assert result.stop_reason == "stop_token"
        assert sum(r.emitted for r in result.rounds) == len(expected) - 1


@pytest.mark.parametrize("max_new", [1, 2, 37])
def test_max_new_tokens_is_exact(tiny, reference, max_new):
    prompt, base = reference
    result = run_method(tiny, OracleTree(base.output_ids, 96, seed=7), prompt, max_new=max_new)
    assert result.output_ids == base.output_ids[:max_new]
    assert result.stop_reason == "max_new_tokens"
