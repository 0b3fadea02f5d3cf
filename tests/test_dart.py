"""DART: the checkpoint (EAGLE-3 layout + mask_rep + draft_length) and the .trie format load, the n-gram
probabilities and the pruned tree match the reference algorithm by hand (losslessness: test_model_drafters.py)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from specbench_methods.checkpoints import Checkpoint, CheckpointError
from specbench_methods.dart import DartDraft, SearchParams, search, to_tree
from specbench_methods.ngram import Trie
from tests.conftest import tiny_model
from tests.drafter_fixtures import edit_checkpoint, write_dart
from tests.helpers import random_prompt


# ---------------------------------------------------------------------------------------------- n-gram trie
def test_trie_probabilities_match_the_reference_example():
    """trie_ngram.cpp's own example: order 3 over 1 2 3 2 2 1 3 2 3 1 2, P(1, 2, 3 | 2 3) = (0.5, 0.5, 0):
    slices starting with (2, 3) continue with 2 or 1 once each; 3 never follows (2, 3) nor (3)."""
    trie = Trie.build([[1, 2, 3, 2, 2, 1, 3, 2, 3, 1, 2]], order=3)
    assert trie.probability([2, 3], np.array([1, 2, 3])).tolist() == [0.5, 0.5, 0.0]
    assert trie.freq[0] == 11  # one slice per start position


def test_trie_matches_brute_force_counts_and_round_trips(tmp_path):
    seqs = [random_prompt(60, vocab=8, seed=s) for s in range(3)]
    trie = Trie.build(seqs, order=3)
    slices = [tuple(s[i:i + 3]) for s in seqs for i in range(len(s))]

    def count(prefix):
        return sum(1 for sl in slices if sl[:len(prefix)] == prefix)

    tokens = np.arange(3, 8)
    for ctx in ([3, 4], [5], [7, 7], [9, 9]):
        expected = []
        for t in tokens:
            p = 0.0
            for n in range(min(2, len(ctx)), 0, -1):
                c = tuple(ctx[len(ctx) - n:])
                if count(c) and count(c + (int(t),)):
                    p = count(c + (int(t),)) / count(c)
                    break
            expected.append(p)
        assert trie.probability(ctx, tokens) == pytest.approx(expected)
    trie.save(tmp_path / "t.trie")
    raw = (tmp_path / "t.trie").read_bytes()
    assert struct.unpack_from("<QQ", raw) == (3, len(trie.token))
    assert struct.unpack_from("<iQiQ", raw, 16)[1:] == (0, int(trie.freq[0]), int(trie.child_start[1]))
    back = Trie.load(tmp_path / "t.trie")
    for field in ("token", "parent", "freq", "child_start", "child_token", "child_id"):
        assert np.array_equal(getattr(back, field), getattr(trie, field)), field


def test_truncated_trie_is_one_line(tmp_path):
    trie = Trie.build([[1, 2, 3, 4]], order=3)
    trie.save(tmp_path / "t.trie")
    (tmp_path / "t.trie").write_bytes((tmp_path / "t.trie").read_bytes()[:-5])
    with pytest.raises(CheckpointError, match="truncated"):
        Trie.load(tmp_path / "t.trie")


# ---------------------------------------------------------------------------------------------- the search
TOKENS = np.array([[10, 11], [20, 21]])
PROBS = np.array([[0.6, 0.4], [0.7, 0.3]])


def test_pruned_tree_by_hand_without_ngram():
    """Scores: (10) ln .6 = -.511, (11) ln .4 = -.916; level 1 adds 2^-0.7 · 0.9 · ln p: (10,20) -.709,
    (11,20) -1.114, (10,21) -1.178, (11,21) -1.583. The best three: (10), (10,20), (11)."""
    kept = search(TOKENS, PROBS, None, [5], frozenset(), SearchParams(top_k=2, beam_width=2, total=3))
    assert [seq for seq, _ in kept] == [(10,), (10, 20), (11,)]
    assert [s for _, s in kept] == pytest.approx([np.log(.6), np.log(.6) + 2 ** -0.7 * 0.9 * np.log(.7), np.log(.4)])
    tree = to_tree(kept)
    assert tree.tokens == [10, 11, 20] and tree.parents == [0, 0, 1]


def test_pruned_tree_by_hand_with_eos_and_ngram():
    """10 is EOS, so a beam of 1 keeps (11); the trie knows only 5 11 21, so 21 gets p_ngram = 1 and 20 gets
    ln(1e-10) · 0.5: (11,21) beats (11,20) although the draft prefers 20."""
    trie = Trie.build([[5, 11, 21]], order=3)
    kept = search(TOKENS, PROBS, trie, [5], frozenset({10}), SearchParams(top_k=2, beam_width=1, total=3))
    assert [seq for seq, _ in kept] == [(10,), (11,), (11, 21)]
    tree = to_tree(kept)
    assert tree.tokens == [10, 11, 21] and tree.parents == [0, 0, 2]


# ---------------------------------------------------------------------------------------------- loading
def test_double_norm_and_mask_slots(distilled):
    """One forward gives draft_length + 1 rows; logits use the final norm twice, as the reference does."""
    target, corpus, folder = distilled("dart", "qwen3")
    draft = DartDraft.load(Checkpoint.read(str(folder), "dart"), target)
    assert draft.config.mask_slots == 4 and draft.midlayer.mask_rep.shape == (128,)
    feats = torch.randn(10, 192)
    from specbench_methods.layers import causal_mask

    with torch.no_grad():
        out, (k, _) = draft.step(feats, torch.arange(10), torch.arange(14), mask=causal_mask(14, 0, feats.device))
    assert out.shape == (5, 64) and k.shape[1] == 14


@pytest.mark.parametrize("edit_tensors,edit_config,message", [
    (lambda t: t.pop("midlayer.mask_rep"), None, "missing tensor 'midlayer.mask_rep'"),
    (None, lambda c: c.pop("draft_length"), "missing key 'draft_length'"),
])
def test_bad_checkpoints_fail_with_one_line(tmp_path, edit_tensors, edit_config, message):
    target = tiny_model("llama", layers=6)
    folder = edit_checkpoint(write_dart(tmp_path / "d", target), edit_tensors, edit_config)
    with pytest.raises(CheckpointError, match=message):
        DartDraft.load(Checkpoint.read(str(folder), "dart"), target)
