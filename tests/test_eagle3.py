"""EAGLE-3: both released layouts load, bad checkpoints fail with one line, and the tree matches the reference
algorithm by hand (losslessness: test_model_drafters.py)."""

from __future__ import annotations

import math

import pytest
import torch

from specbench_methods.checkpoints import Checkpoint, CheckpointError
from specbench_methods.eagle3 import Candidates, Eagle3Draft, beam_search, top_nodes
from specbench_methods.layers import causal_mask
from tests.conftest import tiny_model
from tests.drafter_fixtures import VOCAB, edit_checkpoint, write_eagle3
from tests.helpers import random_prompt


# ---------------------------------------------------------------------------------------------- the tree
def test_kept_nodes_match_the_reference_by_hand():
    """top_k 2, depth 1. Level 1: tokens 0 (0.6), 1 (0.3). Children of 0: 2 (0.55), 3 (0.25); of 1: 0 (0.7),
    2 (0.15). Cumulative: 0.6, 0.3, 0.33, 0.15, 0.21, 0.045; keeping 4 leaves {0.6, 0.3, 0.33, 0.21}."""
    first = torch.tensor([0.6, 0.3, 0.05, 0.05]).log()
    table = torch.tensor([[0.1, 0.1, 0.55, 0.25], [0.7, 0.05, 0.15, 0.1]]).log()
    seen = []

    def expand(tokens, rows, level):
        seen.append((tokens.tolist(), rows.tolist(), level))
        return table

    cands = beam_search(first, expand, top_k=2, depth=1)
    assert seen == [([0, 1], [0, 1], 0)]
    assert cands.tokens.tolist() == [0, 1, 2, 3, 0, 2]
    assert cands.parents.tolist() == [0, 0, 1, 1, 2, 2]
    expected = [0.6, 0.3, 0.33, 0.15, 0.21, 0.045]
    assert [math.exp(s) for s in cands.scores.tolist()] == pytest.approx(expected)
    kept, parents = top_nodes(cands, 4)
    assert kept.tolist() == [0, 1, 2, 4]
    assert parents.tolist() == [0, 0, 1, 2]  # token 2 under node 1 (token 0), token 0 under node 2 (token 1)


def test_top_nodes_keeps_parents_on_ties():
    cands = Candidates(torch.tensor([-1.0, -1.0, -1.0]), torch.tensor([5, 6, 7]), torch.tensor([0, 1, 2]))
    kept, parents = top_nodes(cands, 2)
    assert kept.tolist() == [0, 1] and parents.tolist() == [0, 1]


@pytest.mark.parametrize("top_k,depth,total", [(1, 3, 3), (1, 8, 5), (2, 4, 4), (4, 3, 8), (3, 6, 6), (10, 8, 12)])
def test_levels_past_what_total_keeps_change_no_tree(top_k, depth, total):
    """Eagle3.propose runs min(depth, total - 2) levels: the levels after those hold no kept node, so the trees
    equal those of all `depth` levels (random log-probs, some rounded coarsely so that scores tie)."""
    g = torch.Generator().manual_seed(top_k * 100 + depth * 10 + total)
    vocab = 12
    for case in range(20):
        coarse = case % 2 == 0
        draw = lambda *shape: _log_probs(torch.rand(*shape, vocab, generator=g), coarse)  # noqa: E731
        first, levels = draw(), [draw(top_k) for _ in range(depth)]
        full = beam_search(first, lambda tokens, rows, level: levels[level], top_k, depth)
        cut = beam_search(first, lambda tokens, rows, level: levels[level], top_k, min(depth, total - 2))
        assert [t.tolist() for t in top_nodes(cut, total - 1)] == [t.tolist() for t in top_nodes(full, total - 1)]


def test_top_nodes_of_a_batch_follow_the_rule_row_by_row():
    """top_nodes on a batch of beams (ties included) keeps, row by row, what EAGLE's rule keeps: the `total` best
    scores, ties to the earlier recording index, in recording order, parents renumbered to tree nodes."""
    g = torch.Generator().manual_seed(7)
    first = _log_probs(torch.rand(3, 12, generator=g), coarse=True)
    levels = [_log_probs(torch.rand(3, 4, 12, generator=g), coarse=True) for _ in range(3)]
    cands = beam_search(first, lambda tokens, rows, level: levels[level], 4, 3)
    kept, parents = top_nodes(cands, 15)
    for b in range(3):
        scores, recorded = cands.scores[b].tolist(), cands.parents[b].tolist()
        rule = sorted(sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:15])
        node = {idx: pos + 1 for pos, idx in enumerate(rule)}
        assert kept[b].tolist() == rule
        assert parents[b].tolist() == [0 if recorded[i] == 0 else node[recorded[i] - 1] for i in rule]


def _log_probs(x: torch.Tensor, coarse: bool) -> torch.Tensor:
    logp = torch.log_softmax(x * 4, dim=-1)
    return (logp * 2).round() / 2 if coarse else logp


def test_a_chain_drafts_only_the_steps_it_keeps(distilled):
    """A 2-token chain at depth 5: the newest position's step and one level, not six steps."""
    from tests.drafter_fixtures import make_method
    from tests.helpers import run_method

    target, corpus, folder = distilled("eagle3", "llama")
    method = make_method("eagle3", target, folder, depth=5, top_k=1, total_token=3)
    steps = []
    step = method.draft.step
    method.draft.step = lambda *args, **kwargs: steps.append(1) or step(*args, **kwargs)
    result = run_method(target, method, corpus[0][:40], max_new=24)
    assert len(steps) == 2 * len(result.rounds)


# ---------------------------------------------------------------------------------------------- loading
@pytest.mark.parametrize("variant", [
    dict(layout="flat"),
    dict(layout="flat", draft_vocab=48),
    dict(layout="speculators", qk_norm=True, norm_before_residual=True),
    dict(layout="speculators", head_dim=16),
])
def test_layouts_round_trip(tmp_path, variant):
    """A checkpoint written in a released layout loads back to the same draft (same outputs)."""
    target = tiny_model("qwen3", layers=6)
    corpus = [random_prompt(40, VOCAB, seed=3)]
    folder = write_eagle3(tmp_path / "d", target, corpus if "draft_vocab" in variant else None, steps=0, **variant)
    ckpt = Checkpoint.read(str(folder), "eagle3")
    if variant["layout"] == "speculators":
        assert any(k.startswith("layers.0.") for k in ckpt.tensors) and "transformer_layer_config" in ckpt.config
    draft = Eagle3Draft.load(ckpt, target)
    assert draft.config.qk_norm == variant.get("qk_norm", False)
    assert draft.config.norm_before_residual == variant.get("norm_before_residual", False)
    assert draft.config.capture == [1, 2, 2]
    feats = torch.randn(5, 3 * 64)
    ids = torch.tensor([3, 4, 5, 6, 7])
    again = Eagle3Draft.load(Checkpoint.read(str(folder), "eagle3"), target)
    a, _ = draft.step(feats, ids, torch.arange(5), mask=causal_mask(5, 0, feats.device))
    b, _ = again.step(feats, ids, torch.arange(5), mask=causal_mask(5, 0, feats.device))
    assert torch.equal(a, b)
    if "draft_vocab" in variant:
        assert draft.d2t is not None and draft.to_target(torch.arange(48)).unique().numel() == 48


@pytest.mark.parametrize("edit_tensors,edit_config,message", [
    (lambda t: t.update({"fc.weight": torch.zeros(64, 150)}), None, "'fc.weight'"),
    (lambda t: t.pop("midlayer.mlp.down_proj.weight"), None, "missing tensor 'midlayer.mlp.down_proj.weight'"),
    (lambda t: t.update({"midlayer.mask_rep": torch.zeros(128)}), None, "unexpected tensor 'midlayer.mask_rep'"),
    (lambda t: t.update({"midlayer.self_attn.o_proj.weight": torch.zeros(64, 32)}), None, "'midlayer.self_attn.o_proj.weight' has shape 64×32"),
    (None, lambda c: c.update(vocab_size=500), "vocab_size 500"),
    (None, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 3, 9]) or c.pop("eagle_aux_hidden_state_layer_ids"),
     "do not fit a target with 6 layers"),  # SpecForge's key alone (the exports write vLLM's top-level one too)
    (None, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 4, 10]), "do not fit a target with 6 layers"),
])
def test_bad_checkpoints_fail_with_one_line(tmp_path, edit_tensors, edit_config, message):
    target = tiny_model("llama", layers=6)
    folder = edit_checkpoint(write_eagle3(tmp_path / "d", target), edit_tensors, edit_config)
    with pytest.raises(CheckpointError) as err:
        Eagle3Draft.load(Checkpoint.read(str(folder), "eagle3"), target)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(folder) in str(err.value)


def test_unreachable_hub_checkpoint_is_one_line(monkeypatch):
    """Offline (as in CI), a hub id that is not in the local cache fails with one line naming it."""
    from specbench_cli.core.errors import UsageError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UsageError) as err:
        Checkpoint.read("nobody-here/no-such-eagle3-drafter", "eagle3")
    assert "cannot fetch eagle3 checkpoint 'nobody-here/no-such-eagle3-drafter'" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("layout", ["flat", "speculators"])
def test_rope_settings_written_as_transformers_5_rope_parameters_are_read(tmp_path, layout):
    """transformers 5 (what speculators 0.9 writes) keeps theta and scaling in one `rope_parameters` dict; a
    loader that looked only for `rope_theta` would silently use 10000 (Qwen3 uses 1e6, Llama-3.1 500000)."""
    from specbench_methods.eagle3.checkpoint import read_config
    from specbench_methods.layers import rope_settings

    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}

    def five(c: dict) -> None:
        layer = c.get("transformer_layer_config", c)
        layer.pop("rope_theta", None), layer.pop("rope_scaling", None)
        layer["rope_parameters"] = {"rope_theta": 500000.0, **llama3}

    target = tiny_model("llama", layers=6)
    folder = edit_checkpoint(write_eagle3(tmp_path / "d", target, steps=0, layout=layout), config=five)
    c = read_config(Checkpoint.read(str(folder), "eagle3"), 6)
    assert c.rope_theta == 500000.0 and c.rope_scaling == llama3
    assert rope_settings({"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}) == (1e6, None)
    assert rope_settings({"rope_theta": 1e6, "rope_scaling": None}) == (1e6, None)
    assert rope_settings({}) == (10000.0, None)
