"""Hybrid Verified Decoding on a tiny target with a distilled EAGLE-3: lossless at temperature 0 with forced
switches between the cache draft and EAGLE-3 (both policies, both catch-up variants, two turns), in
distribution at temperature > 0; features that calibration computes from replay equal the ones the live
decode computed; the rollout, quality and simulation maths on hand-made turns; the artifact's errors."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch

from specbench_methods.eagle3 import Eagle3
from specbench_methods.hvd import CLASSES, FEATURES, History, Hvd, HvdFreq, features, token_classes
from specbench_methods.predictors import PayoffPredictor
from specbench_cli.commands.calibrate.command import Latency
from specbench_cli.commands.calibrate.hvd import CacheTurn, frequency_rule, quality, rollout, simulated
from tests.drafter_fixtures import SAMPLING_TEMPERATURE, loaded
from tests.helpers import assert_lossless, assert_multi_turn_lossless, run_method, sampling_p_value

SMALL = {"eagle3": Eagle3.Options(depth=4, top_k=4, total_token=16)}  # a CPU-sized EAGLE-3 tree


@pytest.fixture(scope="module")
def setup(distilled):
    target, corpus, eagle3 = distilled("eagle3", "llama")
    return target, corpus, {"eagle3": str(eagle3)}


def freq(setup, **opts) -> HvdFreq:
    target, _, drafters = setup
    return HvdFreq(HvdFreq.Options(**{**SMALL, **opts}), loaded(target), drafters)


@pytest.fixture(scope="module")
def median_score(setup):
    """A frequency-score threshold in the middle of the non-empty drafts' scores: the route switches often."""
    target, corpus, _ = setup
    rounds = run_method(target, freq(setup, threshold=1e9), corpus[0][:24]).rounds
    return statistics.median(r.extras["router_score"] for r in rounds if r.extras["router_score"] > 0)


def sources(result) -> tuple[set[str], int]:
    used = [r.proposer for r in result.rounds]
    return set(used), sum(a != b for a, b in zip(used, used[1:]))


@pytest.mark.parametrize("variant", [{}, {"lazy_catchup": False}])
def test_frequency_policy_switches_losslessly(setup, median_score, variant):
    target, corpus, _ = setup
    result = assert_lossless(target, freq(setup, threshold=median_score, **variant), corpus[0][:24], min_accepted=40)
    used, switches = sources(result)
    assert used == {"suffix", "eagle3"} and switches >= 4
    assert max(r.accepted for r in result.rounds if r.proposer == "suffix") >= 2  # cache drafts are accepted
    # EAGLE-3's backlog beyond the previous round's tokens: lazy catch-up absorbs whole cache stretches at once
    extra = [r.extras["backlog"] - prev.emitted for prev, r in zip(result.rounds, result.rounds[1:]) if r.proposer == "eagle3"]
    assert (max(extra) > 1) == variant.get("lazy_catchup", True), extra
    assert all(len(r.extras["features"]) == len(FEATURES) for r in result.rounds)


def test_multi_turn_is_lossless(setup, median_score, tmp_path):
    target, corpus, drafters = setup
    assert_multi_turn_lossless(target, freq(setup, threshold=median_score), corpus[1][:24])
    payoff = Hvd(Hvd.Options(**SMALL, threshold=0.0), loaded(target), {**drafters, "hvd": str(write_predictor(tmp_path, 6.0))})
    assert_multi_turn_lossless(target, payoff, corpus[1][:24])


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution(setup):
    target, corpus, _ = setup
    make = lambda: freq(setup, threshold=0.0, eagle3=Eagle3.Options(depth=3, top_k=4, total_token=10))  # noqa: E731  cache whenever it has a draft
    assert sampling_p_value(target, make, corpus[0][:24], SAMPLING_TEMPERATURE) > 1e-3


def write_predictor(folder, threshold: float, seed: int = 0):
    import json

    torch.manual_seed(seed)
    PayoffPredictor(len(FEATURES)).save(folder)
    (folder / "config.json").write_text(json.dumps({"features": list(FEATURES), "width": 256, "threshold": threshold}))
    return folder


def test_payoff_predictor_switches_losslessly_and_needs_its_artifact(setup, tmp_path):
    target, corpus, drafters = setup
    make = lambda folder, **o: Hvd(Hvd.Options(**SMALL, **o), loaded(target), {**drafters, "hvd": str(folder)})  # noqa: E731
    probe = make(write_predictor(tmp_path / "p", 6.0), threshold=1e9)
    scores = [r.extras["router_score"] for r in run_method(target, probe, corpus[0][:24]).rounds if r.extras["features"][2] > 0]
    method = make(tmp_path / "p", threshold=statistics.median(scores))
    result = assert_lossless(target, method, corpus[0][:24], min_accepted=40)
    assert sources(result)[0] == {"suffix", "eagle3"}
    assert make(tmp_path / "p").tau == 6.0  # the card's threshold when --opt threshold is not given
    with pytest.raises(Exception, match="specbench calibrate --method hvd"):
        Hvd(Hvd.Options(**SMALL), loaded(target), drafters)
    (tmp_path / "p" / PayoffPredictor.FILE).write_bytes(b"")
    with pytest.raises(Exception):
        make(tmp_path / "p")


def test_replayed_features_are_the_live_ones(setup, median_score):
    """Calibration's rollout over a replay of the live output reproduces every round's features and route."""
    from specbench_methods.eagle3 import Eagle3
    from specbench_methods.suffix import Suffix
    from specbench_cli.commands.oracle.replay import Trace, replay_turn
    from specbench_cli.core.target import Target

    target, corpus, drafters = setup
    prompt = corpus[0][:24]
    live = run_method(target, freq(setup, threshold=median_score), prompt)
    replayers = {"eagle3": Eagle3(SMALL["eagle3"], loaded(target), drafters),
                 "suffix": Suffix(Suffix.Options(), loaded(target))}
    replay = replay_turn(Target(target, torch.device("cpu")), replayers,
                         Trace("p", 0, "c", "s", prompt, live.output_ids))
    info = replay.walks["suffix"].infos
    turn = CacheTurn("p", len(prompt), np.array(replay.walks["eagle3"].accepted), np.array(replay.walks["suffix"].accepted),
                     np.array([i["score"] for i in info]), np.array([i["match_len"] for i in info]),
                     [i["draft"] for i in info])
    x, chose = rollout(turn, np.zeros((200, len(CLASSES)), np.float32), frequency_rule(median_score))
    starts = np.cumsum([0] + [r.emitted for r in live.rounds])[:-1]
    np.testing.assert_allclose(x[starts], np.array([r.extras["features"] for r in live.rounds]), rtol=1e-5)
    assert [("suffix" if c else "eagle3") for c in chose[starts]] == [r.proposer for r in live.rounds]


def test_token_classes_and_features():
    class Tok:
        texts = ["a", " ", "\n", ",", "(x", "!?", "b c"]

        def __len__(self):
            return len(self.texts)

        def batch_decode(self, ids):
            return [self.texts[i[0]] for i in ids]

    table = token_classes(Tok(), 9)
    #               whitespace  punct  line_break  bracket  delimiter
    assert table[1].tolist() == [1, 0, 0, 0, 0]
    assert table[2].tolist() == [1, 0, 1, 0, 0]
    assert table[3].tolist() == [0, 1, 0, 0, 1]
    assert table[4].tolist() == [0, 0, 0, 1, 0]
    assert table[5].tolist() == [0, 1, 0, 0, 0]
    assert not table[[0, 6, 7, 8]].any()  # letters, and ids past the tokenizer's vocabulary
    history = History()
    for cache, accepted in [(True, 4)] + [(False, 1)] * 8:  # only the last 8 rounds count
        history.add(cache, accepted)
    x = dict(zip(FEATURES, features(2.5, 3, [1, 3, 4, 0], 30, 10, history, table)))
    assert x["suffix_score"] == 2.5 and x["match_len"] == 3 and x["draft_len"] == 4 and x["relative_position"] == 0.25
    assert x["recent_cache_rate"] == 0 and x["recent_accepted"] == 1
    assert x["whitespace_share"] == 0.25 and x["punctuation_share"] == 0.25 and x["bracket_share"] == 0.25


def hand_turn() -> CacheTurn:
    """8 positions; the cache draft (non-empty at even positions) would accept 3 at position 0 and 4 at 4."""
    al_s = np.array([3, 0, 0, 0, 4, 0, 0, 0])
    drafts = [[1] * 5 if t % 2 == 0 else [] for t in range(8)]
    return CacheTurn("h", 10, np.ones(8, int), al_s, np.full(8, 9.0), np.full(8, 2), drafts)


def test_rollout_history_counts_finished_rounds_only():
    turn = hand_turn()
    x, chose = rollout(turn, np.zeros((8, len(CLASSES)), np.float32), frequency_rule(8.0))
    rate, accepted = FEATURES.index("recent_cache_rate"), FEATURES.index("recent_accepted")
    # rounds: cache at 0 (AL 3, ends at 4), cache at 4 (AL 4, ends at 9): positions 1-3 see no finished round
    assert chose[[0, 4]].all() and not chose[[1, 3, 5]].any()
    assert x[:4, accepted].tolist() == [0, 0, 0, 0] and x[4, accepted] == 3 and x[4, rate] == 1
    assert x[:, FEATURES.index("generated")].tolist() == list(range(1, 9))


def test_quality_and_simulation_on_known_answers():
    q = quality(np.array([7, 1, 8, 2, 6]), np.array([6.5, 6.0, 1.0, 0.0, 9.0]))
    assert q["p_high"] == 0.6 and q["p_predicted_high"] == 0.6
    assert q["precision"] == pytest.approx(2 / 3) and q["recall"] == pytest.approx(2 / 3)
    lat = Latency(eagle3=10.0, other=5.0, catchup_per_token=0.0, other_name="suffix")
    zero = np.zeros((8, len(CLASSES)), np.float32)
    cache = simulated([hand_turn()], zero, lambda x: np.ones(len(x), bool), lat)
    assert cache["cache_share"] == 1.0 and cache["tau"] == 4.0 and cache["cycles_per_1k"] == 250.0  # 8 tokens, 2 rounds
    assert cache["tokens_per_s"] == pytest.approx(8 / 0.010)
    eagle = simulated([hand_turn()], zero, lambda x: np.zeros(len(x), bool), lat)
    assert eagle["eagle3_share"] == 1.0 and eagle["tau"] == 2.0 and eagle["tokens_per_s"] == pytest.approx(8 / 0.040)
