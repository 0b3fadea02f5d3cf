"""DFlash: the z-lab checkpoint schema loads (and fails clearly), cached context equals recomputed context,
and a block draft is the argmax at each mask position (losslessness: test_model_drafters.py)."""

from __future__ import annotations


import pytest
import torch

from specbench_methods.checkpoints import Checkpoint, CheckpointError
from specbench_methods.dflash import DFlashDraft
from tests.conftest import tiny_model
from tests.drafter_fixtures import VOCAB, edit_checkpoint, make_method, write_dflash


def test_context_is_cached_not_recomputed(distilled):
    """Running the draft in two pieces (cached context + new context) equals one pass over all of it."""
    target, corpus, folder = distilled("dflash", "qwen3")
    draft = DFlashDraft.load(Checkpoint.read(str(folder), "dflash"), target)
    from tests.drafter_fixtures import target_pass

    feats, _ = target_pass(target, corpus[0][:40], draft.config.capture)
    block = torch.tensor([corpus[0][40]] + [VOCAB - 1] * 7)
    with torch.no_grad():
        whole, _ = draft(feats, 0, block, 40)
        _, first_kv = draft(feats[:30], 0, block, 30)
        split, _ = draft(feats[30:], 30, block, 40, first_kv)
    assert torch.allclose(whole, split, atol=1e-5)


@pytest.mark.parametrize("edit,message", [
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 2, 7]), "do not fit a target with 6 layers"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 2]), "'fc.weight' reads 192 features"),
    (lambda c: c["dflash_config"].pop("mask_token_id"), "missing key 'mask_token_id'"),
    (lambda c: c["dflash_config"].update(mask_token_id=500), "mask_token_id 500"),
    (lambda c: c.update(hidden_size=32), "'layers.0.self_attn.q_proj.weight' has shape"),
    (lambda c: c["dflash_config"].update(conv_kernel_size=4), "DFlash2"),
])
def test_bad_checkpoints_fail_with_one_line(tmp_path, edit, message):
    target = tiny_model("qwen3", layers=6)
    folder = edit_checkpoint(write_dflash(tmp_path / "d", target), config=edit)
    with pytest.raises(CheckpointError) as err:
        DFlashDraft.load(Checkpoint.read(str(folder), "dflash"), target)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_released_schema_without_layer_ids_gets_evenly_spaced_layers(tmp_path):
    """SpecForge's rule when target_layer_ids is absent: evenly spaced from 1 to L-3."""
    target = tiny_model("qwen3", layers=6)
    folder = edit_checkpoint(write_dflash(tmp_path / "d", target), config=lambda c: c["dflash_config"].pop("target_layer_ids"))
    draft = DFlashDraft.load(Checkpoint.read(str(folder), "dflash"), target)
    assert draft.config.capture == [1, 2, 3]


def test_block_draft_is_the_argmax_at_each_mask_position(distilled):
    """Hand-derived round: block [root, mask × 7] at the root's position, context = the prompt's features;
    draft token j = argmax of the target head at block position j (no shift)."""
    from types import SimpleNamespace

    from specbench_cli.core.target import Target
    from tests.drafter_fixtures import target_pass

    target, corpus, folder = distilled("dflash", "qwen3")
    method = make_method("dflash", target, folder)
    prompt = corpus[2][:30]
    t = Target(target, torch.device("cpu"))
    method.attach(t)
    root = int(t.prefill(prompt).argmax())
    state = SimpleNamespace(tokens=prompt + [root], prompt_len=30, target=t, temperature=0.0, generator=None,
                            timed=lambda part: __import__("contextlib").nullcontext(), lanes={})
    method.start(state)
    (tree,) = method.propose([state])
    feats, _ = target_pass(target, prompt, method.capture)
    block = torch.tensor([root] + [VOCAB - 1] * 7)
    with torch.no_grad():
        hidden, _ = method.draft(feats, 0, block, 30)
        expected = target.lm_head(hidden[1:]).argmax(-1).tolist()
    assert tree.tokens == expected and tree.is_chain


def test_rope_parameters_of_transformers_5_are_read(tmp_path):
    """theta in `rope_parameters` (transformers 5), not `rope_theta`: read, not replaced by 10000."""
    from specbench_methods.dflash import read_config

    def five(c: dict) -> None:
        c.pop("rope_theta", None), c.pop("rope_scaling", None)
        c["rope_parameters"] = {"rope_theta": 1000000.0, "rope_type": "default"}

    target = tiny_model("qwen3", layers=6)
    folder = edit_checkpoint(write_dflash(tmp_path / "d", target), config=five)
    c = read_config(Checkpoint.read(str(folder), "dflash"), 6)
    assert c.rope_theta == 1000000.0 and c.rope_scaling is None


def as_speculators(c: dict, **top) -> None:
    """Rewrite a z-lab DFlash config.json as speculators 0.9 writes one (same tensor names)."""
    dflash = c.pop("dflash_config")
    layer = {k: c.pop(k) for k in list(c) if k not in ("architectures", "block_size")}
    c.update({"speculators_model_type": "dflash", "transformer_layer_config": layer,
              "draft_vocab_size": layer["vocab_size"], "mask_token_id": dflash["mask_token_id"],
              "aux_hidden_state_layer_ids": [i + 1 for i in dflash["target_layer_ids"]], **top})


def test_a_speculators_config_reads_as_the_zlab_one(tmp_path):
    from specbench_methods.dflash import read_config

    target = tiny_model("qwen3", layers=6)
    original = read_config(Checkpoint.read(str(write_dflash(tmp_path / "z", target)), "dflash"), 6)
    folder = edit_checkpoint(write_dflash(tmp_path / "s", target), config=as_speculators)
    assert read_config(Checkpoint.read(str(folder), "dflash"), 6) == original
    for top, message in (({"draft_vocab_size": 32}, "reduced draft vocabulary"),
                         ({"sample_from_anchor": True}, "sample_from_anchor")):
        folder = edit_checkpoint(write_dflash(tmp_path / f"bad{len(message)}", target),
                                 config=lambda c: as_speculators(c, **top))
        with pytest.raises(CheckpointError, match=message):
            read_config(Checkpoint.read(str(folder), "dflash"), 6)
