"""SpS and FlashHead: a draft model that shares the target's vocabulary drafts chains with its own cache;
both stay lossless, SpS keeps the target distribution when sampling, and FlashHead's head scores exactly
the probed clusters' rows."""

from __future__ import annotations

import copy

import pytest
import torch

from methods.flashhead import (Clustering, FlashHead, FlashHeadLayer, balanced_assign, build_clustering, load_assets,
                               save_assets)
from methods.sps import SpS
from tests.conftest import tiny_model
from tests.drafter_fixtures import VOCAB, loaded
from tests.helpers import assert_lossless, assert_multi_turn_lossless, random_prompt, run_method, sampling_p_value


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def setup(request, tmp_path_factory):
    """The target, a copy of it as the draft model (accepts everything), and a perturbed copy (accepts some)."""
    target = tiny_model(request.param)
    root = tmp_path_factory.mktemp("sps")
    target.save_pretrained(root / "copy")
    noisy = copy.deepcopy(target)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn_like(p) * 0.3 * p.std())
    noisy.save_pretrained(root / "noisy")
    return target, root


def make(cls, target, folder, **opts):
    return cls(cls.Options(**opts), loaded(target), {"sps": str(folder)})


def test_exact_copy_accepts_every_draft(setup):
    target, root = setup
    result = assert_lossless(target, make(SpS, target, root / "copy"), random_prompt(30), min_accepted=120)
    assert all(r.accepted == r.tree_size for r in result.rounds[:-1])  # every round but a cut last one
    assert all(r.target_forwards == 1 for r in result.rounds)
    assert all(r.phases["draft_head"] > 0 for r in result.rounds)


@pytest.mark.parametrize("k", [1, 6])
def test_noisy_draft_is_lossless(setup, k):
    target, root = setup
    assert_lossless(target, make(SpS, target, root / "noisy", k=k), random_prompt(30, seed=4), min_accepted=20)


def test_multi_turn_is_lossless(setup):
    target, root = setup
    assert_multi_turn_lossless(target, make(SpS, target, root / "noisy"), random_prompt(30, seed=5))


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution(setup):
    target, root = setup
    if target.config.model_type != "llama":
        pytest.skip("one architecture is enough for the (slow) distribution test")
    assert sampling_p_value(target, lambda: make(SpS, target, root / "noisy", k=3), random_prompt(30, seed=6)) > 1e-3


# ---------------------------------------------------------------------------------------------- FlashHead
@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_flashhead_is_lossless_and_caches_its_clustering(setup, cache):
    target, root = setup
    method = make(FlashHead, target, root / "copy", cluster_size=8, n_probes=4)
    assert method.flash.members.shape == (12, 8)
    result = assert_lossless(target, method, random_prompt(30, seed=7), min_accepted=40)
    assert len(result.rounds) < 150
    assert len(list((cache / "flashhead").glob("*/flash_head_assets/clustering_cache.safetensors"))) == 1
    again = make(FlashHead, target, root / "copy", cluster_size=8, n_probes=4)
    assert torch.equal(again.flash.members, method.flash.members)


@pytest.mark.slow
def test_flashhead_sampling_stays_lossless_in_distribution(setup, cache):
    target, root = setup
    if target.config.model_type != "llama":
        pytest.skip("one architecture is enough for the (slow) distribution test")
    make_method = lambda: make(FlashHead, target, root / "copy", cluster_size=8, n_probes=4, k=3)  # noqa: E731
    assert sampling_p_value(target, make_method, random_prompt(30, seed=6)) > 1e-3


def test_probed_set_by_hand():
    """Clusters {0,1} along +x, {2,3} along +y, {4,5} along −x; special token 5. h = (0.2, 1) opens the +y
    cluster only, so tokens 2, 3 and 5 are scored, and token 0 (the dense argmax) is not."""
    centroids = torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    clustering = Clustering(centroids, torch.tensor([0, 0, 1, 1, 2, 2]), [5], 1)
    weight = torch.tensor([[5.0, 5.0], [1.0, 0.0], [0.0, 1.0], [0.5, 2.0], [-1.0, 0.0], [0.0, 0.5]])
    head = FlashHeadLayer(weight, clustering, n_probes=1)
    h = torch.tensor([0.2, 1.0])
    assert sorted(head.candidates(h).tolist()) == [2, 3, 5]
    assert head.top_token(h) == 3 and int((weight @ h).argmax()) == 0
    head2 = FlashHeadLayer(weight, clustering, n_probes=2)
    assert sorted(head2.candidates(h).tolist()) == [0, 1, 2, 3, 5] and head2.top_token(h) == 0


def test_balanced_clusters_and_released_asset_names(tmp_path):
    head = torch.randn(VOCAB, 16)
    rows = torch.nn.functional.normalize(head, dim=1)
    assign = balanced_assign(rows, rows[:12], cap=8)
    assert torch.bincount(assign, minlength=12).tolist() == [8] * 12
    clustering = build_clustering(head, cluster_size=8, special=[0])
    assert torch.bincount(clustering.assignments).tolist() == [8] * 12
    save_assets(clustering, tmp_path)
    back = load_assets(tmp_path, VOCAB, 16)
    assert torch.equal(back.assignments, clustering.assignments) and back.special == [0] and back.n_probes == 1
    from safetensors.torch import load_file

    assert set(load_file(tmp_path / "flash_head_assets" / "clustering_cache.safetensors")) == {"centroids", "cluster_assignments"}
    # spherical k-means should beat random balanced clusters on mean cosine to the own centroid
    own = (rows * back.centroids.T[back.assignments]).sum(1).mean()
    random_assign = torch.randperm(VOCAB) % 12
    random_centroids = torch.nn.functional.normalize(torch.zeros(12, 16).index_add_(0, random_assign, rows), dim=1)
    assert own > (rows * random_centroids[random_assign]).sum(1).mean()


@pytest.mark.parametrize("cls", [SpS, FlashHead])
def test_deferred_final_token_saves_one_target_forward_per_round(setup, cache, cls):
    """deferred=false runs each round's root through the target separately: same output, 2 forwards a round."""
    target, root = setup
    prompt = random_prompt(30, seed=8)
    extra = {"cluster_size": 8} if cls is FlashHead else {}
    naive = assert_lossless(target, make(cls, target, root / "noisy", deferred=False, **extra), prompt, min_accepted=10)
    assert all(r.target_forwards == 2 for r in naive.rounds)
    assert all(r.phases["extra_forward"] > 0 for r in naive.rounds)  # timed as its own phase, not as commit
    deferred = run_method(target, make(cls, target, root / "noisy", **extra), prompt, max_new=150)
    assert all(r.target_forwards == 1 for r in deferred.rounds)
    assert [r.accepted for r in deferred.rounds] == [r.accepted for r in naive.rounds]


def test_chain_is_the_draft_models_greedy_continuation(setup):
    """k draft tokens = the draft model's own greedy continuation of the committed tokens."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    target, root = setup
    method = make(SpS, target, root / "noisy", k=5)
    tokens = random_prompt(20, seed=11)
    state = SimpleNamespace(tokens=tokens, target=SimpleNamespace(device=torch.device("cpu")), temperature=0.0,
                            generator=None, timed=lambda part: __import__("contextlib").nullcontext(), lanes={})
    method.start(state)
    (tree,) = method.propose([state])
    draft = AutoModelForCausalLM.from_pretrained(root / "noisy")
    expected = draft.generate(torch.tensor([tokens]), max_new_tokens=5, do_sample=False, min_new_tokens=5)[0, 20:]
    assert tree.tokens == expected.tolist()
