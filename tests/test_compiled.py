"""The compiled path (static shapes: rows padded to a bucket, attention over the whole preallocated cache) is
lossless for a representative set of methods: the baseline, a chain, trees, a routed method, ConFu's side
tokens and soft prompt, and SpS's extra target forward.

Most tests compile with the `aot_eager` backend: it traces the same static-shape graph torch.compile builds
and runs it without generating kernels, which keeps CI fast; one test goes through inductor itself."""

from __future__ import annotations

import pytest
import torch

from specbench_methods.baseline import Baseline
from specbench_cli.core.target import Target
from tests.drafter_fixtures import make_method
from tests.helpers import OracleTree, assert_lossless, baseline_output, random_prompt, run_method

BUCKETS = (1, 4, 16, 64)


def compiled(model: torch.nn.Module, backend: str = "aot_eager") -> Target:
    target = Target(model, torch.device("cpu"), compile=backend, buckets=BUCKETS)
    target.plan(512)
    target.warm_up()
    return target


@pytest.mark.slow
@pytest.mark.parametrize("chain", [False, True])
def test_oracle_trees_and_chains(tiny, chain):
    prompt = random_prompt(40)
    reference = baseline_output(tiny, prompt)
    target = compiled(tiny)
    result = assert_lossless(tiny, OracleTree(reference, 96, seed=3, chain=chain), prompt, min_accepted=60, target=target)
    assert {r.tree_size + 1 for r in result.rounds} - set(range(1, 65)) == set()  # every verify fit a bucket
    assert not target.late_compiles


@pytest.mark.slow
def test_baseline_through_inductor():
    """The real compiler: warm-up compiles each bucket once, then decoding never compiles again (one
    architecture: inductor is slow to compile a bucket on a small CPU)."""
    from tests.conftest import tiny_model

    tiny = tiny_model("llama")
    prompt = random_prompt(30, seed=4)
    target = Target(tiny, torch.device("cpu"), compile="inductor", buckets=(1, 32))
    target.plan(len(prompt) + 60)
    seconds = target.warm_up()
    assert set(seconds) == {1, 32} and all(s > 0 for s in seconds.values())
    reference = baseline_output(tiny, prompt, max_new=60)
    assert run_method(tiny, Baseline(Baseline.Options(), None), prompt, max_new=60, target=target).output_ids == reference
    result = assert_lossless(tiny, OracleTree(reference, 96, seed=5), prompt, max_new=60, min_accepted=20, target=target)
    assert max(r.tree_size for r in result.rounds) >= 2 and not target.late_compiles


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eagle3", "dflash", "confu"])
def test_model_drafters(distilled, name):
    arch = "qwen3" if name == "confu" else "llama"
    target, corpus, folder = distilled(name, arch)
    opts = {"depth": 4, "top_k": 4, "total_token": 16} if name != "dflash" else {}
    assert_lossless(target, make_method(name, target, folder, **opts), corpus[0][:24], min_accepted=20,
                    target=compiled(target))


@pytest.mark.slow
def test_routed_method(distilled):
    from specbench_methods.dflash import DFlash
    from specbench_methods.eagle3 import Eagle3
    from specbench_methods.whiflash import WhiFlashEntropy
    from tests.drafter_fixtures import loaded

    target, corpus, eagle3 = distilled("eagle3", "llama")
    _, _, dflash = distilled("dflash", "llama")

    def method(threshold: float) -> WhiFlashEntropy:
        options = WhiFlashEntropy.Options(threshold=threshold, eagle3=Eagle3.Options(depth=4, top_k=4, total_token=16),
                                          dflash=DFlash.Options(block_size=4))
        return WhiFlashEntropy(options, loaded(target), {"eagle3": str(eagle3), "dflash": str(dflash)})

    entropies = sorted(r.extras["entropy"] for r in run_method(target, method(-1.0), corpus[0][:24]).rounds)
    result = assert_lossless(target, method(entropies[len(entropies) // 2]), corpus[0][:24], min_accepted=20,
                             target=compiled(target))
    assert len({r.proposer for r in result.rounds}) == 2  # the router switched: both proposers verified compiled


def test_sps_extra_forward(tmp_path):
    """deferred=false: the root's own one-token forward and a verify of only the drafts, both compiled
    (the draft model is a copy of the target, so every draft is accepted)."""
    from specbench_methods.sps import SpS
    from tests.conftest import tiny_model
    from tests.drafter_fixtures import loaded

    target = tiny_model("llama")
    target.save_pretrained(tmp_path / "copy")
    method = SpS(SpS.Options(deferred=False), loaded(target), {"sps": str(tmp_path / "copy")})
    result = assert_lossless(target, method, random_prompt(30, seed=8), min_accepted=60, target=compiled(target))
    assert all(r.target_forwards == 2 for r in result.rounds)
