"""The drafter trainer on a tiny target: loss goes down, held-out accuracy is reported per TTT position, the
checkpoint loads back through the method's normal loader, and decoding with it is lossless."""

from __future__ import annotations

import json

import pytest

from specbench_cli.distill import Corpus, cache_features, training_prompts
from specbench_cli.errors import UsageError
from specbench_cli.train_drafter import TrainSettings, train
from tests.conftest import tiny_model
from tests.drafter_fixtures import greedy_corpus, make_method
from tests.helpers import assert_lossless


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    target = tiny_model("llama", layers=6)
    seqs = greedy_corpus(target, n=6, new=120)
    return target, cache_features(target, seqs, [24] * len(seqs), tmp_path_factory.mktemp("corpus"), [1, 2, 3])


def test_eagle3_training_learns_and_loads_back(corpus, tmp_path):
    target, data = corpus
    settings = TrainSettings(steps=240, lr=3e-3, warmup=10, ttt=3, draft_vocab=64, intermediate=128, eval_every=80,
                             holdout=0.2)
    card = train(target, data, tmp_path / "eagle3", settings, "specbench train-drafter (test)")
    first, last = card["history"][0], card["history"][-1]
    assert last["loss"] < first["loss"] or last["heldout_top1"][0] > first["heldout_top1"][0]
    assert len(last["heldout_top1"]) == 3 and card["steps"] == 240
    assert json.loads((tmp_path / "eagle3" / "card.json").read_text())["data"]["sequences"] == 6
    method = make_method("eagle3", target, tmp_path / "eagle3")
    assert method.draft.config.draft_vocab == 64
    assert_lossless(target, method, data.sequences[0][:24], min_accepted=20)


def test_resume_continues_from_the_saved_state(corpus, tmp_path):
    target, data = corpus
    settings = TrainSettings(steps=20, warmup=2, ttt=2, draft_vocab=64, intermediate=64, eval_every=10)
    train(target, data, tmp_path / "d", settings, "x")
    card = train(target, data, tmp_path / "d", TrainSettings(**{**settings.__dict__, "steps": 30}), "x", resume=True)
    assert [h["step"] for h in card["history"]] == [10, 20, 30]


def test_corpus_round_trip_and_training_prompts(corpus):
    _, data = corpus
    again = Corpus.load(data.folder)
    assert again.tokens == data.tokens and again.feats(0, [3, 1]).shape == (len(data.sequences[0]), 128)
    prompts = training_prompts(9)
    assert len(prompts) == 9 and len(set(prompts)) == 9


def test_untrainable_method_is_a_clear_error(corpus, tmp_path):
    target, data = corpus
    with pytest.raises(UsageError, match="not implemented yet"):
        train(target, data, tmp_path / "x", TrainSettings(method="dflash"), "x")
