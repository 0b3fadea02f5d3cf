"""SpS and FlashHead: a draft model that shares the target's vocabulary drafts chains with its own cache;
both stay lossless, SpS keeps the target distribution when sampling, and FlashHead's head scores exactly
the probed clusters' rows."""

from __future__ import annotations

import copy

import pytest
import torch

from specbench_methods.flashhead import (Clustering, FlashHead, FlashHeadLayer, balanced_assign, build_clustering, load_assets,
                               save_assets)
from specbench_methods.sps import SpS
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
    assert int(head.best(h[None])[0]) == 3 and int((weight @ h).argmax()) == 0
    head2 = FlashHeadLayer(weight, clustering, n_probes=2)
    assert sorted(head2.candidates(h).tolist()) == [0, 1, 2, 3, 5] and int(head2.best(h[None])[0]) == 0


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


@pytest.mark.parametrize("batch", [1, 3])
def test_a_sliding_window_draft_drafts_its_own_greedy_continuation(tmp_path, batch):
    """A draft model whose upper layer attends through a sliding window of 8 (Qwen3's layer_types), over prompts
    longer than it: round after round, alone and in a batch, each chain is the model's own greedy continuation as
    transformers computes it (its own sliding cache and masks)."""
    import random

    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                         use_sliding_window=True, sliding_window=8, max_window_layers=1, attn_implementation="sdpa")
    Qwen3ForCausalLM(config).eval().save_pretrained(tmp_path / "sliding")
    draft = AutoModelForCausalLM.from_pretrained(tmp_path / "sliding").eval()
    assert draft.config.layer_types == ["full_attention", "sliding_attention"]
    method = make(SpS, tiny_model("qwen3"), tmp_path / "sliding", k=4)
    assert method.shape.window == 8 and method.shape.mixed
    states = [_fake_state(random_prompt(12 + 5 * i, seed=30 + i)) for i in range(batch)]
    for s in states:
        method.start(s)
    choices = random.Random(1)
    for _ in range(4):
        for s, tree in zip(states, method.propose(states)):
            n = len(s.tokens)
            expected = draft.generate(torch.tensor([s.tokens]), max_new_tokens=4, do_sample=False, min_new_tokens=4)
            assert tree.tokens == expected[0, n:].tolist()
            s.tokens += tree.tokens[:choices.choice([0, 2, 4])] + [choices.randrange(3, VOCAB)]


# ---------------------------------------------------------------------------------------------- batches
def _fake_state(tokens: list[int], temperature: float = 0.0, seed: int = 0):
    """What `propose` reads of a DecodeState, without a target (SpS never reads the target to draft)."""
    from types import SimpleNamespace

    return SimpleNamespace(tokens=list(tokens), target=SimpleNamespace(device=torch.device("cpu")),
                           temperature=temperature, generator=torch.Generator().manual_seed(seed),
                           timed=lambda part: __import__("contextlib").nullcontext(), lanes={})


# Which sequences draft together, round by round: alone, in batches of every size, in another order, one joining
# late (sequence 4 starts in round 2), and a batch's sequence later alone (its row gathered into a cache of its own)
# or with sequences from other batches (rows gathered from several caches into one).
GROUPS = [[[0], [1, 2], [3]], [[0, 1, 2, 3]], [[2, 0], [3, 1, 4]], [[1], [0, 2, 3, 4]], [[4, 2], [0], [1, 3]],
          [[3, 1, 0, 2, 4]], [[0, 4], [1], [2], [3]]]


@pytest.mark.parametrize("cls, temperature", [(SpS, 0.0), pytest.param(SpS, 1.0, marks=pytest.mark.slow), (FlashHead, 0.0)])
def test_drafts_are_the_same_in_any_batch(setup, cache, cls, temperature):
    """`propose` over any grouping of sequences drafts for each what it drafts alone, whatever the others cached
    and however many drafts each keeps: prompts of different lengths, and rounds that keep 0 to k drafts, or all k
    (two unseen tokens), so every row is padded differently; sampled drafts draw the same tokens from (nearly) the
    same distributions with each sequence's own generator."""
    import random

    target, root = setup
    extra = {"cluster_size": 8, "n_probes": 4} if cls is FlashHead else {}
    prompts = [random_prompt(5 + 11 * i, seed=20 + i) for i in range(5)]

    method = make(cls, target, root / "noisy", k=4, **extra)  # it keeps nothing per sequence but in the states

    def run(grouped: bool) -> list[list]:
        choices = random.Random(3)
        states = [_fake_state(p, temperature, seed=i) for i, p in enumerate(prompts)]
        for s in states:
            method.start(s)
        drafts: list[list] = [[] for _ in states]
        for r, groups in enumerate(GROUPS):
            for group in (groups if grouped else [[i] for g in groups for i in g]):
                group = [i for i in group if i != 4 or r >= 2]
                if not group:
                    continue
                for i, tree in zip(group, method.propose([states[i] for i in group])):
                    drafts[i].append((tree.tokens, tree.draft_probs))
                    kept = choices.choice([0, 1, 4, 4])  # how many drafts the "target" accepts, then its bonus
                    states[i].tokens += tree.tokens[:kept] + [choices.randrange(3, 96)]
        return drafts

    alone, batched = run(False), run(True)
    assert [[t for t, _ in d] for d in batched] == [[t for t, _ in d] for d in alone]
    for a, b in zip(alone, batched):
        for (_, pa), (_, pb) in zip(a, b):
            assert (pa is None) == (pb is None) == (temperature == 0)
            if pa is not None:
                torch.testing.assert_close(pb, pa, atol=1e-5, rtol=1e-4)


def test_a_batch_of_one_runs_in_its_own_cache(setup):
    """A sequence drafting alone writes into its own cache in place and rewinds it by its length (batch 1's
    arithmetic); a batch's rows draft in a copy, and each row's new entries are copied back to its own cache."""
    target, root = setup
    method = make(SpS, target, root / "noisy", k=3)
    a, b = _fake_state(random_prompt(9, seed=1)), _fake_state(random_prompt(14, seed=2))
    for s in (a, b):
        method.start(s)
    own = method.lane(a).kv
    (tree,) = method.propose([a])
    buffer = own.k
    assert method.lane(a).kv is own and own.length == len(method.lane(a).cached) == 9 + 2  # k - 1 drafts fed back
    a.tokens += tree.tokens[:1] + [5]
    method.propose([a])
    assert own.k is buffer and own.length == 9 + 1 + 1 + 2  # rewound to the accepted draft, then bonus and drafts
    alone = own.k[:, :own.length].clone()
    a.tokens += [7]
    method.propose([a, b])
    assert own.k is buffer and own.length == len(method.lane(a).cached) == len(a.tokens) + 2
    assert method.lane(b).kv.length == len(method.lane(b).cached) == 14 + 2
    assert torch.equal(own.k[:, :11], alone[:, :11])  # what it kept, through the batch's copy and back


def test_batched_flashhead_scores_each_rows_candidates():
    """`best` over a batch picks, row by row, what it picks for the row alone, with clusters of
    different sizes (empty slots in the member table) and special tokens."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(50, 8, generator=generator)
    assignments = torch.randint(0, 7, (50,), generator=generator)  # uneven clusters: -1 slots in `members`
    centroids = torch.nn.functional.normalize(torch.randn(8, 7, generator=generator), dim=0)
    head = FlashHeadLayer(weight, Clustering(centroids, assignments, [3, 49], 2), n_probes=2)
    assert (head.members < 0).any()
    hidden = torch.randn(64, 8, generator=generator)
    assert head.best(hidden).tolist() == [int(head.best(h[None])[0]) for h in hidden]


# ---------------------------------------------------------------------------------------------- compiled
def _recorded(method) -> list[list[int]]:
    """The chains `method` drafts from now on, in order."""
    chains: list[list[int]] = []
    propose = method.propose
    method.propose = lambda states: [chains.append(t.tokens) or t for t in propose(states)]
    return chains


@pytest.mark.slow
@pytest.mark.parametrize("cls", [SpS, FlashHead])
def test_compiled_draft_model_drafts_what_eager_drafts(setup, cache, cls):
    """With `--compile` the draft model's forwards (over buffers read whole) and its head are static-shape graphs:
    round for round the chains equal eager's, the output is lossless, over 100 rounds and more nothing recompiles
    (dynamo fails on a recompile) and nothing compiles inside a round."""
    target, root = setup
    if (cls is SpS) != (target.config.model_type == "llama"):
        pytest.skip("SpS on Llama and FlashHead on Qwen3 are enough for this slow test")
    extra = {"cluster_size": 8} if cls is FlashHead else {}
    eager, compiled = (make(cls, target, root / "noisy", k=4, **extra) for _ in range(2))
    seconds = compiled.compile("aot_eager", 512, 1)
    head = "flash head" if cls is FlashHead else "head"
    assert sorted(seconds) == sorted([f"{cls.name} forward 1x{n}" for n in (1, 2, 8)]
                                     + [f"{cls.name} {head} 1x{compiled.draft.config.hidden_size}"])
    graphs = compiled.graphs
    calls = []
    compiled.graphs = lambda *args, **static: calls.append(args[0]) or graphs(*args, **static)
    chains = {"eager": _recorded(eager), "compiled": _recorded(compiled)}
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed in range(3):
            prompt = random_prompt(30, seed=40 + seed)
            run_method(target, eager, prompt, max_new=120)
            assert_lossless(target, compiled, prompt, max_new=120, min_accepted=10)
    assert chains["compiled"] == chains["eager"] and len(chains["eager"]) >= 100
    assert calls.count("forward") >= 4 * (len(chains["compiled"]) - 3)  # every round but a prompt's first: graphs only
    assert calls.count(head) == 4 * len(chains["compiled"])  # every draft token from the compiled head
    assert not graphs.late


@pytest.mark.slow
def test_compiled_draft_model_in_a_batch(setup):
    """Three sequences at a time, leaving at different rounds, through graphs of every batch size compiled before
    the first round: each gets its batch-1 output."""
    from tests.helpers import baseline_output
    from tests.test_batch import run_batch

    target, root = setup
    if target.config.model_type != "llama":
        pytest.skip("one architecture is enough for this slow test")
    method = make(SpS, target, root / "noisy", k=4)
    method.compile("aot_eager", 512, 3)
    prompts = [random_prompt(8 + 13 * i, seed=50 + i) for i in range(5)]
    results, _ = run_batch(target, method, prompts, 3, 60)
    assert [r.output_ids for r in results] == [baseline_output(target, p, 60) for p in prompts]
    assert not method.late_compiles()
