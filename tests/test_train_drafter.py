"""The drafter trainer on a tiny target: for every trainable method the loss goes down, held-out accuracy
is reported per draft position, the checkpoint loads back through the method's normal loader, and decoding
with it is lossless. The batched training passes (many DFlash blocks / DART slot blocks in one forward) must
give exactly what the inference path computes for one anchor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from specbench_methods.checkpoints import Checkpoint
from specbench_methods.layers import causal_mask
from specbench_cli.commands.train.distill import Corpus, cache_features, cache_topk, calibration_prompts, training_prompts
from specbench_cli.core.errors import UsageError
from specbench_cli.registry import recipe_class
from specbench_cli.commands.train.recipes import Sample, kl_to_topk
from specbench_cli.commands.train.train import TrainSettings, lr_factor, train, trained_span
from tests.conftest import tiny_model
from tests.drafter_fixtures import greedy_corpus, make_method
from tests.helpers import assert_lossless


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    target = tiny_model("llama", layers=6)
    seqs = greedy_corpus(target, n=6, new=120)
    data = cache_features(target, seqs, [24] * len(seqs), tmp_path_factory.mktemp("corpus"), [1, 2, 3])
    cache_topk(target, data, k=8)
    return target, data


def sample(data: Corpus, recipe, i: int = 0) -> Sample:
    seq = data.sequences[i]
    return Sample(torch.tensor(seq), data.next(i), data.feats(i, recipe.layers) if recipe.layers else torch.empty(0),
                  data.prompt_lens[i], *data.topk(i))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dflash", "dart", "sps", "confu"])
def test_each_recipe_learns_and_loads_back_lossless(corpus, tmp_path, method):
    target, data = corpus
    settings = TrainSettings(method=method, steps=90, lr=3e-3, warmup=10, draft_vocab=64, intermediate=128,
                             eval_every=30, holdout=0.2, anchors=16)
    card = train(target, data, tmp_path / method, settings, "specbench train-drafter (test)")
    first, last = card["history"][0], card["history"][-1]
    assert last["loss"] < first["loss"]
    assert len(last["heldout_top1"]) == {"dflash": 7, "dart": 5, "sps": 1, "confu": 3}[method]
    method_obj = make_method(method, target, tmp_path / method)
    assert_lossless(target, method_obj, data.sequences[1][:24], min_accepted=1)


def test_dflash_blocks_trained_together_match_one_block_at_inference(corpus):
    target, data = corpus
    recipe = recipe_class("dflash")(target, data, TrainSettings(method="dflash", intermediate=64))
    recipe.model.eval()
    s = sample(data, recipe)
    anchors = torch.tensor([5, 30, 31, 90])
    batched = recipe.block_logits(s, anchors)
    for n, a in enumerate(anchors.tolist()):
        block = torch.full((8,), recipe.model.config.mask_token_id)
        block[0] = s.ids[a]
        hidden, _ = recipe.model(s.feats[:a], 0, block, a)
        torch.testing.assert_close(batched[n], recipe.model.logits(hidden[1:]), atol=1e-4, rtol=1e-4)


def test_dart_slot_blocks_share_the_prefix_exactly(corpus):
    target, data = corpus
    recipe = recipe_class("dart")(target, data, TrainSettings(method="dart", intermediate=64, draft_vocab=64))
    recipe.model.eval()
    s, S = sample(data, recipe), recipe.model.config.mask_slots
    anchors = torch.tensor([3, 40, 41, 100])
    out = recipe.level_outputs(s, anchors)
    T = s.ids.shape[0] - 1
    for n, a in enumerate(anchors.tolist()):  # the inference call: context rows 0..a, then the slots
        alone, _ = recipe.model.step(s.feats[:a + 1], s.ids[1:a + 2], torch.arange(a + 1 + S),
                                     mask=causal_mask(a + 1 + S, 0, s.ids.device))
        torch.testing.assert_close(out[a], alone[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out[T + n * S: T + (n + 1) * S], alone[1:], atol=1e-4, rtol=1e-4)


def test_confu_future_in_training_is_the_one_a_verify_forward_computes(corpus):
    """f from the trainer's contemplate pass = the side token's hidden state in Target.verify."""
    from specbench_cli.core.target import SideTokens, Target, VerifyExtras
    from specbench_cli.core.tree import DraftTree

    target, data = corpus
    recipe = recipe_class("confu")(target, data, TrainSettings(method="confu", intermediate=64, draft_vocab=64))
    s, a = sample(data, recipe), 50
    trained = recipe.futures(s, torch.tensor([20, a]))[1]
    live = Target(target, torch.device("cpu"))
    live.reserve(recipe.parts.soft_prompt())
    live.prefill(s.ids[:a].tolist())  # position a is the root of the next verify; its contemplate sits at a + 1
    tree = DraftTree([], [])
    embed = recipe.parts.contemplate(s.feats[a]).detach()[None]
    side = SideTokens(embed, torch.tensor([1]), torch.ones(1, 1, dtype=torch.bool))
    live.verify(int(s.ids[a]), tree, VerifyExtras(side=side))
    torch.testing.assert_close(live.side_hidden[0], trained.detach(), atol=1e-4, rtol=1e-4)


def test_topk_kl_is_zero_for_the_same_distribution_and_positive_otherwise():
    logits = torch.randn(3, 10)
    p = torch.softmax(logits, -1)
    top = p.topk(4, dim=-1)
    same = kl_to_topk(torch.log_softmax(logits, -1), top.indices, top.values)
    other = kl_to_topk(torch.log_softmax(torch.randn(3, 10), -1), top.indices, top.values)
    assert abs(float(same)) < 1e-6 and float(other) > 0


@pytest.mark.slow
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
    card = train(target, data, tmp_path / "d", TrainSettings(**{**settings.__dict__, "steps": 30}), "y", resume=True)
    assert [h["step"] for h in card["history"]] == [10, 20, 30]
    assert card["command"] == "y" and card["earlier_commands"] == ["x"]  # the card names every session's command


def test_learning_rate_warms_up_holds_and_anneals_to_zero():
    flat = TrainSettings(steps=100, warmup=10)
    assert [lr_factor(k, flat) for k in (0, 9, 50, 99)] == [0.1, 1.0, 1.0, 1.0]
    annealed = TrainSettings(steps=100, warmup=10, anneal=40)
    assert lr_factor(59, annealed) == 1.0 and lr_factor(60, annealed) == 1.0  # the anneal starts at step 60
    assert lr_factor(80, annealed) == pytest.approx(0.5) and lr_factor(100, annealed) == pytest.approx(0.0)
    factors = [lr_factor(k, annealed) for k in range(60, 101)]
    assert all(a > b for a, b in zip(factors, factors[1:]))


def test_resume_with_more_steps_ends_annealed(corpus, tmp_path):
    """A run continued with --resume, more --steps and --anneal finishes at a learning rate of 0."""
    target, data = corpus
    settings = TrainSettings(steps=10, warmup=2, ttt=2, draft_vocab=64, intermediate=64, eval_every=10)
    train(target, data, tmp_path / "d", settings, "x")
    train(target, data, tmp_path / "d", TrainSettings(**{**settings.__dict__, "steps": 20, "anneal": 10}), "x", resume=True)
    state = torch.load(tmp_path / "d" / "train_state.pt", weights_only=False)
    assert state["step"] == 20 and state["opt"]["param_groups"][0]["lr"] == pytest.approx(0.0, abs=1e-12)


def test_resume_takes_this_sessions_learning_rate(corpus, tmp_path, monkeypatch):
    """A warm restart: a run annealed to 0 and continued with another --lr trains at that rate from its first
    resumed step (the saved state alone would keep the old peak and the last rate, 0)."""
    target, data = corpus
    settings = TrainSettings(steps=10, warmup=2, anneal=5, ttt=2, draft_vocab=64, intermediate=64, eval_every=10)
    train(target, data, tmp_path / "d", settings, "x")
    seen = []
    original = torch.optim.AdamW.step

    def record(opt, *args, **kwargs):
        seen.append(opt.param_groups[0]["lr"])
        return original(opt, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", record)
    train(target, data, tmp_path / "d", TrainSettings(**{**settings.__dict__, "steps": 12, "anneal": 0, "lr": 3e-4}),
          "y", resume=True)
    assert seen == [pytest.approx(3e-4), pytest.approx(3e-4)]


def test_a_run_resumed_on_a_grown_corpus_keeps_its_choices_and_its_held_out_set(corpus, tmp_path):
    """After the corpus grows, --resume keeps the draft's corpus-derived choices (DFlash's mask token, picked
    among tokens the first corpus never uses) and never moves a sequence it trained on into the held-out set."""
    from specbench_cli.commands.train.recipes.dflash import unused_token
    from specbench_cli.commands.train.train import split

    target, data = corpus
    mask = unused_token(data.first(4), 96)
    grown = Corpus.in_memory(target, data.sequences[:4] + [[mask] + data.sequences[5], data.sequences[4]],
                             data.prompt_lens[:4] + [25, 24], data.layers)  # the new rows use the old mask token
    settings = TrainSettings(method="dflash", steps=4, warmup=2, intermediate=64, anchors=8, eval_every=4, holdout=0.25)
    train(target, grown.first(4), tmp_path / "d", settings, "x")
    longer = TrainSettings(**{**settings.__dict__, "steps": 8})
    card = train(target, grown, tmp_path / "d", longer, "y", resume=True)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["dflash_config"]["mask_token_id"] == mask != unused_token(grown, 96)
    assert card["data"]["grown_from"] == [4] and card["data"]["sequences"] == 6 and card["steps"] == 8
    held_before, trained_before = split([4], settings)
    held, trained = split([4, 6], settings)
    assert set(held_before) <= set(held) <= set(held_before) | {4, 5} and set(trained_before) <= set(trained)
    with pytest.raises(UsageError, match="trained on 6 corpus sequences and the corpus now gives 5"):
        train(target, grown.first(5), tmp_path / "d", longer, "z", resume=True)


@pytest.mark.parametrize("method", ["eagle3", "dflash", "dart", "sps"])
def test_a_run_started_from_a_checkpoint_keeps_its_weights_choices_and_held_out_set(corpus, tmp_path, method):
    """--init: the draft starts from the checkpoint's weights, shape and vocabulary (not the settings'), and
    when the checkpoint trained on the same corpus its held-out sequences stay held out."""
    from specbench_cli.commands.train.train import split

    target, data = corpus
    first = TrainSettings(method=method, steps=4, warmup=2, ttt=2, draft_vocab=64, intermediate=64, anchors=8,
                          eval_every=4, holdout=0.25)
    train(target, data.first(4), tmp_path / "a", first, "x")
    warm = TrainSettings(**{**first.__dict__, "lr": 1e-30, "intermediate": 32, "draft_vocab": 32, "slots": 2,
                            "draft_layers": 1, "init": str(tmp_path / "a")})  # a rate too small to move fp16 weights
    card = train(target, data, tmp_path / "b", warm, "y")
    assert card["init"] == {"from": str(tmp_path / "a"), "steps": 4, "commands": ["x"],
                            "heldout_top1_per_position": json.loads((tmp_path / "a" / "card.json").read_text())["heldout_top1_per_position"]}
    assert card["data"]["grown_from"] == [4] and card["data"]["sequences"] == 6
    assert [h["step"] for h in card["history"]] == [0, 4]  # the checkpoint scored on this run's held-out set first
    assert len(card["history"][0]["heldout_top1"]) == len(card["heldout_top1_per_position"])
    assert (tmp_path / "a" / "config.json").read_text() == (tmp_path / "b" / "config.json").read_text()
    before, after = (Checkpoint.read(str(tmp_path / f), method).tensors for f in "ab")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    again = train(target, data, tmp_path / "b", TrainSettings(**{**warm.__dict__, "init": "", "steps": 8}), "z", resume=True)
    assert again["settings"]["init"] == str(tmp_path / "a")  # resumed without --init: rebuilt on its start
    third = train(target, data, tmp_path / "e", TrainSettings(**{**warm.__dict__, "init": str(tmp_path / "b")}), "w")
    assert third["init"]["commands"] == ["x", "y", "z"]  # the whole lineage, not only the last checkpoint's
    assert (tmp_path / "a" / "config.json").read_text() == (tmp_path / "b" / "config.json").read_text()
    held_a, trained_a = split([4], first)
    held_b, _ = split([4, 6], warm)
    assert set(held_a) <= set(held_b) and not set(held_b) & set(trained_a)
    with pytest.raises(UsageError, match="trained on this corpus with --seed 0; pass the same seed"):
        train(target, data, tmp_path / "c", TrainSettings(**{**warm.__dict__, "seed": 1}), "z")
    with pytest.raises(UsageError, match="--init: the checkpoint trained on 4 corpus sequences and the corpus now gives 3"):
        train(target, data.first(3), tmp_path / "d", warm, "z")


def test_corpus_round_trip_and_training_prompts(corpus):
    _, data = corpus
    again = Corpus.load(data.folder)
    assert again.tokens == data.tokens and again.feats(0, [3, 1]).shape == (len(data.sequences[0]), 128)
    prompts = training_prompts(9)
    assert len(prompts) == 9 and len(set(prompts)) == 9
    every, held = training_prompts(), calibration_prompts(10**6)
    assert len(every) + len(held) == 7473 + 1923 + 4535 + 1600 and len(held) == 870 + 100  # 1/16 of each file
    assert not set(every) & set(held) and set(every[:9]) == set(prompts)


def test_a_long_sequence_trains_on_its_answer_and_the_end_of_its_prompt():
    assert trained_span(300, 384) == slice(0, 300)
    assert trained_span(900, 384) == slice(516, 900)  # a 740-token passage and its 160-token answer


def test_a_late_source_joins_after_the_corpora_built_without_it(monkeypatch):
    """The prompts the project wrote joined the order at `LATE_JOIN`: the list's first 2,000 (the committed
    drafters' corpus) and the calibration prompts the routers used are what they were without them."""
    from specbench_cli.commands.train import distill

    with_late, calibration = training_prompts(), calibration_prompts(200)
    name = "written-tasks.jsonl.xz"
    content = distill.vendored_bytes(distill.DATASET_DIR / "train" / name, distill.TRAIN_FILES[name][0], name)
    written = {json.loads(line)["prompt"] for line in content.decode().splitlines()}
    monkeypatch.setattr(distill, "TRAIN_FILES", {k: v for k, v in distill.TRAIN_FILES.items() if k not in distill.LATE_FILES})
    before = training_prompts()
    join = distill.LATE_JOIN
    assert with_late[:join] == before[:join] and calibration == calibration_prompts(200)
    assert with_late[join] in written and with_late[join + 1] == before[join] and with_late[join + 2] in written
    assert set(with_late) - set(before) <= written and len(with_late) - len(before) == 1600 - 100


def test_minutes_stop_training_at_the_next_evaluation(corpus, tmp_path):
    target, data = corpus
    settings = TrainSettings(steps=500, warmup=2, ttt=1, draft_vocab=64, intermediate=64, eval_every=4, minutes=1e-9)
    card = train(target, data, tmp_path / "d", settings, "x")
    assert card["steps"] == 4 and [h["step"] for h in card["history"]] == [4]
    assert (tmp_path / "d" / "config.json").exists()  # stopped early, exported all the same


def test_minutes_count_this_sessions_training_only(corpus, tmp_path):
    """A resumed run's --minutes limit this session: hours spent by earlier sessions must not stop it at once."""
    target, data = corpus
    settings = TrainSettings(steps=4, warmup=2, ttt=1, draft_vocab=64, intermediate=64, eval_every=4)
    train(target, data, tmp_path / "d", settings, "x")
    state = torch.load(tmp_path / "d" / "train_state.pt", weights_only=False)
    torch.save({**state, "seconds": 3600.0}, tmp_path / "d" / "train_state.pt")
    card = train(target, data, tmp_path / "d", TrainSettings(**{**settings.__dict__, "steps": 12, "minutes": 30}), "y",
                 resume=True)
    assert [h["step"] for h in card["history"]] == [4, 8, 12]


def test_a_run_killed_while_saving_its_state_keeps_the_last_one(corpus, tmp_path, monkeypatch):
    target, data = corpus
    settings = TrainSettings(steps=4, warmup=2, ttt=1, draft_vocab=64, intermediate=64, eval_every=4)
    train(target, data, tmp_path / "d", settings, "x")
    original = torch.save

    def killed_halfway(obj, path):
        Path(path).write_bytes(b"half a state")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed_halfway)
    with pytest.raises(KeyboardInterrupt):
        train(target, data, tmp_path / "d", TrainSettings(**{**settings.__dict__, "steps": 8}), "y", resume=True)
    monkeypatch.setattr(torch, "save", original)
    assert torch.load(tmp_path / "d" / "train_state.pt", weights_only=False)["step"] == 4


def test_a_method_without_a_drafter_is_a_clear_error(corpus, tmp_path):
    target, data = corpus
    with pytest.raises(UsageError, match="no training recipe for it; trainable: eagle3, dflash, dart, confu, sps"):
        train(target, data, tmp_path / "x", TrainSettings(method="suffix"), "x")


def test_an_interrupted_export_never_leaves_a_loadable_half_drafter(tmp_path, monkeypatch):
    """Loaders look for config.json: publish takes it out first and puts it in last, so a crash between the
    moves leaves a folder no loader takes for a drafter (the old weights under a new config, or the reverse)."""
    import os

    from specbench_cli.commands.train import train as training

    out, staging = tmp_path / "drafter", tmp_path / "drafter" / ".export-1"
    staging.mkdir(parents=True)
    (out / "config.json").write_text('{"old": true}')
    (out / "model.safetensors").write_bytes(b"old")
    (staging / "config.json").write_text('{"new": true}')
    (staging / "model.safetensors").write_bytes(b"new")
    moved = []

    def crash_after_one(src, dst):
        if moved:
            raise KeyboardInterrupt  # killed between two moves
        moved.append(dst)
        os.rename(src, dst)

    monkeypatch.setattr(training.os, "replace", crash_after_one)
    with pytest.raises(KeyboardInterrupt):
        training.publish(staging, out)
    assert not (out / "config.json").exists() and (out / "model.safetensors").read_bytes() == b"new"
    monkeypatch.undo()
    staging2 = tmp_path / "drafter" / ".export-2"
    staging2.mkdir()
    (staging2 / "config.json").write_text('{"new": true}')
    (staging2 / "model.safetensors").write_bytes(b"new")
    training.publish(staging2, out)
    assert json.loads((out / "config.json").read_text()) == {"new": True} and not staging2.exists()


def test_a_corpus_in_memory_holds_what_its_folder_holds(corpus):
    """The fixtures train on `Corpus.in_memory`; it must give the trainer the same records as the folder."""
    target, data = corpus
    held = Corpus.in_memory(target, data.sequences, data.prompt_lens, data.layers, topk=8)
    assert held.folder is None and held.where == "in memory" and held.has_topk and held.tokens == data.tokens
    for i in (0, len(data.sequences) - 1):
        assert torch.equal(held.feats(i, [3, 1]), data.feats(i, [3, 1]))
        assert torch.equal(held.next(i), data.next(i))
        assert all(torch.equal(a, b) for a, b in zip(held.topk(i), data.topk(i)))


@pytest.mark.parametrize("training", [True, False], ids=["training", "evaluating"])
@pytest.mark.parametrize("method", ["eagle3", "dflash", "dart", "sps", "confu"])
def test_recipes_make_every_tensor_on_the_samples_device(corpus, method, training):
    """On a GPU the loop trains on CUDA samples; a recipe tensor made without naming a device would land
    elsewhere. Here the default device is `meta` while the target and the sample stay on the CPU, so any
    such tensor meets CPU tensors in an op and fails, as it would on a GPU."""
    target, data = corpus
    recipe = recipe_class(method)(target, data, TrainSettings(method=method, intermediate=64, draft_vocab=64, anchors=8))
    recipe.model.train(training)
    s = sample(data, recipe)
    with torch.device("meta"):
        loss, stats = recipe.loss(s)
    assert loss.device.type == "cpu" and torch.isfinite(loss) and stats


def test_teacher_passes_over_several_sequences_give_what_one_pass_each_gives(corpus, monkeypatch):
    """Right padding never reaches a real position: grouped passes match a pass per sequence."""
    from specbench_cli.commands.train import distill

    target, data = corpus
    seqs = [s[:30 + 17 * i] for i, s in enumerate(data.sequences)]  # unequal lengths: every group is padded
    monkeypatch.setattr(distill, "tokens_per_pass", lambda device: distill.TOKENS_PER_PASS)  # as on a GPU
    together = distill.in_order(distill.teacher_rows(target, seqs, [1, 3]))
    tops = distill.in_order(distill.topk_rows(target, seqs, 4))
    assert len(distill._length_groups(seqs, distill.TOKENS_PER_PASS)) < len(seqs)
    monkeypatch.setattr(distill, "tokens_per_pass", lambda device: 1)  # every sequence alone, as on a CPU
    alone = distill.in_order(distill.teacher_rows(target, seqs, [1, 3]))
    tops_alone = distill.in_order(distill.topk_rows(target, seqs, 4))
    for (f, n), (f1, n1), (i, p), (i1, p1), seq in zip(together, alone, tops, tops_alone, seqs):
        assert f.shape == f1.shape == (len(seq), 2 * target.config.hidden_size) and (n == n1).all()
        assert np.allclose(f.astype(np.float32), f1.astype(np.float32), atol=2e-3) and (i == i1).all()
        assert np.allclose(p.astype(np.float32), p1.astype(np.float32), atol=1e-3)


@pytest.mark.slow
def test_a_grown_corpus_holds_what_a_build_of_all_its_prompts_holds(embedded, tmp_path):
    """`--prompts` past a corpus' size answers only the new prompts; the grown folder must hold what building
    all of them at once gives (the batches line up), its first rows untouched, and its old top-k files gone."""
    from specbench_cli.commands.train import distill

    texts, layers = training_prompts(4), [1, 8]
    grown = distill.build(embedded, texts[:2], tmp_path / "grown", layers, max_new_tokens=6, batch_size=2)
    np.save(tmp_path / "grown" / "topk_probs.npy", np.zeros(3))  # stale: must not survive the growth
    small = grown
    grown = distill.extend(embedded, grown, texts, max_new_tokens=6, batch_size=2)
    whole = distill.build(embedded, texts, tmp_path / "whole", layers, max_new_tokens=6, batch_size=2)
    assert grown.sequences == whole.sequences and grown.prompt_lens == whole.prompt_lens and not grown.has_topk
    assert np.array_equal(grown.features, whole.features) and np.array_equal(grown.next_token, whole.next_token)
    assert np.array_equal(small.features, grown.features[:small.tokens])  # the old memory map still reads
    first = distill.Corpus.load(tmp_path / "grown").first(2)
    assert first.sequences == small.sequences and first.tokens == small.tokens
    assert torch.equal(first.feats(1, [8]), small.feats(1, [8]))
    with pytest.raises(UsageError, match="built with --max-new-tokens 6 --seed 0"):
        distill.extend(embedded, grown, training_prompts(5), max_new_tokens=7, batch_size=2)
    with pytest.raises(UsageError, match="other prompts than the first 4"):
        distill.extend(embedded, grown, training_prompts(5)[::-1], max_new_tokens=6, batch_size=2)


@pytest.mark.slow
def test_a_killed_build_resumes_from_its_answers_and_a_shipped_corpus_is_not_generated_again(embedded, tmp_path,
                                                                                           monkeypatch):
    """Finished answer batches are logged, so a killed build generates only the rest (a batch cut mid-write
    is dropped); answers shipped with the drafters (an xz-compressed corpus.json) are not generated at all; either
    must give the corpus an uninterrupted build gives, and answers to other prompts are refused."""
    from specbench_cli.datasets import write_vendored

    from specbench_cli.commands.train import distill

    texts, layers = training_prompts(6), [1, 8]
    whole = distill.build(embedded, texts, tmp_path / "whole", layers, max_new_tokens=6, batch_size=2)
    assert not (tmp_path / "whole" / distill.ANSWERS).exists()  # corpus.json holds them now
    calls = []
    real = embedded.model.generate
    monkeypatch.setattr(embedded.model, "generate", lambda **kw: calls.append(len(kw["input_ids"])) or real(**kw))

    killed = tmp_path / "killed"
    killed.mkdir()
    distill.generate(embedded, texts[:4], 6, 2, log=killed / distill.ANSWERS)  # two batches finished...
    with (killed / distill.ANSWERS).open("a") as f:
        f.write('{"max_new_tokens": 6, "prompt_le')  # ...and a third cut by the kill
    calls.clear()
    resumed = distill.build(embedded, texts, killed, layers, max_new_tokens=6, batch_size=2)
    assert calls == [2] and resumed.sequences == whole.sequences
    assert np.array_equal(resumed.features, whole.features)

    shipped = tmp_path / "corpus.json.xz"
    write_vendored(shipped, (tmp_path / "whole" / "corpus.json").read_bytes())
    calls.clear()
    small = distill.build(embedded, texts[:3], tmp_path / "first", layers, 6, 2, shipped=shipped)
    grown = distill.extend(embedded, small, texts, 6, 2, shipped=shipped)
    assert calls == [] and grown.sequences == whole.sequences and small.sequences == whole.sequences[:3]
    other = distill.build(embedded, texts[:2], tmp_path / "other", layers, 7, 2, shipped=shipped)
    assert calls == [2] and len(other.sequences[0]) > 0  # built with another --max-new-tokens: generated
    calls.clear()  # shipped answers are found by prompt, wherever it stands in the list
    mixed = distill.build(embedded, [texts[4], training_prompts(7)[6], texts[1]], tmp_path / "mixed", layers, 6, 2,
                          shipped=shipped)
    assert calls == [1] and mixed.sequences[0] == whole.sequences[4] and mixed.sequences[2] == whole.sequences[1]

    (tmp_path / "wrong").mkdir()
    distill.generate(embedded, texts[::-1][:2], 6, 2, log=tmp_path / "wrong" / distill.ANSWERS)
    with pytest.raises(UsageError, match="answers to other prompts; delete it"):
        distill.build(embedded, texts, tmp_path / "wrong", layers, 6, 2)
