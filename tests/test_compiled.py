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
    """WhiFlash switching between EAGLE-3 and DFlash, the target and both drafters compiled."""
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
    routed = method(entropies[len(entropies) // 2])
    drafters = {name: p.compile("aot_eager", 512, 1) for name, p in routed.proposers.items()}
    assert all(drafters.values()), "each of the router's drafters compiled its steps"
    result = assert_lossless(target, routed, corpus[0][:24], min_accepted=20, target=compiled(target))
    assert len({r.proposer for r in result.rounds}) == 2  # the router switched: both proposers verified compiled
    assert not any(p.late_compiles() for p in routed.proposers.values())


@pytest.mark.slow
def test_hvd_switching_compiled(distilled):
    """Hybrid Verified Decoding (frequency policy) switching between the suffix cache and EAGLE-3, whose lazy
    catch-up absorbs whole cache stretches at once, the target and EAGLE-3 compiled."""
    from specbench_cli.core.method import proposers
    from specbench_methods.eagle3 import Eagle3
    from specbench_methods.hvd import HvdFreq
    from tests.drafter_fixtures import loaded

    target, corpus, eagle3 = distilled("eagle3", "llama")

    def method(threshold: float) -> HvdFreq:
        options = HvdFreq.Options(threshold=threshold, eagle3=Eagle3.Options(depth=4, top_k=4, total_token=16))
        return HvdFreq(options, loaded(target), {"eagle3": str(eagle3)})

    scores = sorted(r.extras["router_score"] for r in run_method(target, method(1e9), corpus[0][:24], 80).rounds
                    if r.extras["router_score"] > 0)
    routed = method(scores[len(scores) // 2])
    graphs = [name for p in proposers(routed) for name in p.compile("aot_eager", 512, 1)]  # as the runner does
    assert {name.split()[1] for name in graphs} == {"step", "head"}  # EAGLE-3's; the suffix cache has none
    result = assert_lossless(target, routed, corpus[0][:24], 80, min_accepted=20, target=compiled(target))
    assert {r.proposer for r in result.rounds} == {"suffix", "eagle3"}  # the router switched
    assert not any(p.late_compiles() for p in proposers(routed))


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


# ---------------------------------------------------------------------------------------------- compiled drafters
DRAFTER_OPTIONS = {"eagle3": {"depth": 4, "top_k": 4, "total_token": 16}, "confu": {"depth": 4, "top_k": 4, "total_token": 16},
                   "dflash": {}, "dart": {}}


def drafter(distilled, name: str, backend: str | None = "aot_eager", lanes: int = 1):
    """The distilled method `name` on its tiny target, its draft steps compiled (None: eager), and its trees as it
    drafts them (tokens and parents of each, in order)."""
    target, corpus, folder = distilled(name, "qwen3" if name == "confu" else "llama")
    method = make_method(name, target, folder, **DRAFTER_OPTIONS[name])
    if backend is not None:
        seconds = method.compile(backend, 512, lanes)
        assert seconds and all(s > 0 for s in seconds.values())
        assert {n.split()[1] for n in seconds} >= {"head"}  # the head is a graph beside the steps'
    trees: list[tuple[list[int], list[int]]] = []
    propose = method.propose

    def recording(states):
        out = propose(states)
        trees.extend((t.tokens, t.parents) for t in out)
        return out

    method.propose = recording
    return target, corpus, method, trees


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eagle3", "confu", "dflash", "dart"])
def test_compiled_drafters_draft_what_eager_drafts(distilled, name):
    """A compiled drafter (static buffers read whole, its keys written by the host) drafts the eager drafter's
    trees round for round, losslessly, and compiles nothing inside a round."""
    target, corpus, eager, eager_trees = drafter(distilled, name, None)
    *_, compiled, compiled_trees = drafter(distilled, name)
    prompt = corpus[0][:24]
    run_method(target, eager, prompt, max_new=150)
    assert_lossless(target, compiled, prompt, min_accepted=60)
    assert compiled_trees == eager_trees and len(eager_trees) > 10
    assert not compiled.late_compiles()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eagle3", "confu", "dflash", "dart"])
def test_compiled_drafters_never_recompile(distilled, name):
    """Over 100 rounds and more (four prompts, caches of every length up to the planned one) a compiled drafter's
    graphs neither break (fullgraph) nor recompile: dynamo is told to fail on a recompile."""
    target, corpus, method, trees = drafter(distilled, name)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for prompt in corpus:
            run_method(target, method, prompt[:24], max_new=200)
    assert len(trees) >= 100 and not method.late_compiles()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eagle3", "dflash", "dart"])
def test_compiled_drafters_in_a_batch(distilled, name):
    """Three sequences at a time, leaving at different rounds: each gets its batch-1 output, through graphs of
    every batch size compiled before the first round."""
    from tests.test_batch import run_batch

    target, corpus, method, _ = drafter(distilled, name, lanes=3)
    prompts = [c[:12 + 5 * i] for i, c in enumerate(corpus)]
    results, _ = run_batch(target, method, prompts, 3, 80)
    assert [r.output_ids for r in results] == [baseline_output(target, p, 80) for p in prompts]
    assert not method.late_compiles()


@pytest.mark.slow
def test_compiled_drafter_through_inductor(distilled):
    """The real compiler on EAGLE-3's two steps: the drafts equal eager's round for round."""
    target, corpus, eager, eager_trees = drafter(distilled, "eagle3", None)
    *_, compiled, compiled_trees = drafter(distilled, "eagle3", "inductor")
    prompt = corpus[1][:24]
    run_method(target, eager, prompt, max_new=100)
    assert_lossless(target, compiled, prompt, max_new=100, min_accepted=40)
    assert compiled_trees == eager_trees and not compiled.late_compiles()
