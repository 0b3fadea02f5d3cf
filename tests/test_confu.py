"""ConFu: contemplate tokens and the soft prompt never change the target's logits, the future token reaches
the draft, and our checkpoint format loads (and fails clearly). Losslessness: test_model_drafters.py."""

from __future__ import annotations


import pytest
import torch

from specbench_methods.checkpoints import CheckpointError
from specbench_cli.core.target import Target
from specbench_cli.core.target import SideTokens, VerifyExtras
from specbench_cli.core.tree import DraftTree
from tests.conftest import tiny_model
from tests.drafter_fixtures import edit_checkpoint, make_method, write_confu
from tests.helpers import random_prompt


def test_side_tokens_and_soft_prompt_leave_target_logits_unchanged(tiny):
    """Two rounds through a plain target and through one with a soft prompt and contemplate tokens."""
    cfg = tiny.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    soft = [(torch.randn(cfg.num_key_value_heads, 5, head_dim), torch.randn(cfg.num_key_value_heads, 5, head_dim))
            for _ in range(cfg.num_hidden_layers)]
    plain, confu = Target(tiny, torch.device("cpu")), Target(tiny, torch.device("cpu"))
    confu.reserve(soft)
    prompt = random_prompt(20)
    assert torch.allclose(plain.prefill(prompt), confu.prefill(prompt), atol=1e-5)
    tree = DraftTree([5, 6, 7, 8, 9], [0, 0, 1, 1, 3])
    side = SideTokens(torch.randn(6, cfg.hidden_size), torch.tensor(tree.depths()) + 1, tree.ancestor_mask())
    with_side = VerifyExtras(side=side)
    for path in ([0, 1, 3, 5], [0, 2]):
        a, b = plain.verify(11, tree), confu.verify(11, tree, with_side)
        assert torch.allclose(a, b, atol=1e-5)
        assert confu.side_hidden.shape == (6, cfg.hidden_size)
        plain.commit(path)
        confu.commit(path)
        assert plain.length == confu.length
    first = confu.side_hidden.clone()
    confu.verify(11, tree, with_side)  # the same side tokens over a longer prefix give other hidden states
    assert not torch.allclose(first, confu.side_hidden)


def test_the_future_token_reaches_the_draft(distilled, tmp_path):
    """f is taken from the accepted contemplate token after round 1, and its [f] entry moves the draft."""
    from types import SimpleNamespace

    from specbench_methods.layers import causal_mask
    from tests.helpers import run_method

    target, corpus, _ = distilled("confu", "qwen3")
    method = make_method("confu", target, write_confu(tmp_path / "c", target, scale=1.0))
    with_f, original = [], method.shared_kv
    method.shared_kv = lambda state: (kv := original(state), with_f.append(kv is not None))[0]
    run_method(target, method, corpus[0][:24], max_new=4)
    assert with_f[:2] == [False, True]

    state = SimpleNamespace(target=SimpleNamespace(length=10), lanes={})
    method.lane(state).future = torch.randn(target.config.hidden_size)
    extra = method._future_kv(state)  # [f]: a key every query sees, after the (empty) cache
    feats, ids, positions = torch.randn(10, 3 * target.config.hidden_size), torch.arange(10), torch.arange(10)
    plain = causal_mask(10, 0, feats.device)
    mask = torch.cat((torch.ones(10, 1, dtype=torch.bool), plain), 1)
    with torch.no_grad():
        without, _ = method.draft.step(feats, ids, positions, mask=plain)
        withf, _ = method.draft.step(feats, ids, positions, mask=mask, extra=extra)
    assert not torch.allclose(without, withf, atol=1e-4)


@pytest.mark.parametrize("edit,message", [
    ((None, lambda c: c.pop("confu")), "missing key 'confu'"),
    ((lambda t: t.update({"confu.soft_prompt.keys": torch.zeros(2, 2, 4, 16)}), None), "'confu.soft_prompt.keys' has shape"),
    ((lambda t: t.pop("confu.future.experts"), None), "missing tensor 'confu.future.experts'"),
])
def test_bad_checkpoints_fail_with_one_line(tmp_path, edit, message):
    target = tiny_model("llama", layers=6)
    folder = edit_checkpoint(write_confu(tmp_path / "c", target), *edit)
    with pytest.raises(CheckpointError) as err:
        make_method("confu", target, folder)
    assert message in str(err.value) and "\n" not in str(err.value)
