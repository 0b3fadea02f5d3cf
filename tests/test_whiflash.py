"""WhiFlash on a tiny target with distilled EAGLE-3 and DFlash drafters: lossless at temperature 0 with
forced switches (so lazy catch-up and KV-only prefill run), in every catch-up variant, over two turns, and
at temperature > 0 in distribution; the neural router's artifact format and its missing-artifact error."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from specbench_methods.checkpoints import CheckpointError, fingerprint
from specbench_methods.predictors import Router
from specbench_methods.dflash import DFlash
from specbench_methods.eagle3 import Eagle3
from specbench_methods.whiflash import WhiFlashEntropy, WhiFlashNeural
from tests.drafter_fixtures import SAMPLING_TEMPERATURE, loaded
from tests.helpers import assert_lossless, assert_multi_turn_lossless, run_method, sampling_p_value

SMALL = {"eagle3": Eagle3.Options(depth=4, top_k=4, total_token=16), "dflash": DFlash.Options(block_size=4)}  # CPU-sized


@pytest.fixture(scope="module")
def setup(distilled):
    target, corpus, eagle3 = distilled("eagle3", "llama")
    _, _, dflash = distilled("dflash", "llama")
    return target, corpus, {"eagle3": str(eagle3), "dflash": str(dflash)}


def entropy_method(setup, **opts) -> WhiFlashEntropy:
    target, _, drafters = setup
    return WhiFlashEntropy(WhiFlashEntropy.Options(**{**SMALL, **opts}), loaded(target), drafters)


@pytest.fixture(scope="module")
def median_entropy(setup):
    """A threshold in the middle of the entropies the target shows, so the router switches often."""
    target, corpus, _ = setup
    rounds = run_method(target, entropy_method(setup, threshold=-1.0), corpus[0][:24]).rounds
    return statistics.median(r.extras["entropy"] for r in rounds)


@pytest.mark.parametrize("variant", [{}, {"lazy_catchup": False}, {"kv_only": False}])
def test_switching_is_lossless_and_catches_up(setup, median_entropy, variant):
    target, corpus, _ = setup
    result = assert_lossless(target, entropy_method(setup, threshold=median_entropy, **variant), corpus[0][:24],
                             min_accepted=40)
    used = [r.proposer for r in result.rounds]
    switches = sum(a != b for a, b in zip(used, used[1:]))
    assert {"eagle3", "dflash"} <= set(used) and switches >= 4, used
    backlogs = [r.extras["backlog"] for r in result.rounds if r.proposer == "eagle3"]
    if variant.get("lazy_catchup", True):
        assert max(backlogs) > 1  # an idle stretch was caught up in one batch
    else:  # always in sync: the previous round's tokens and the newest position, which catch-up leaves pending
        rounds = result.rounds  # (a DFlash round can commit a whole block, so EAGLE-3's depth is no bound)
        assert all(r.extras["backlog"] <= prev.emitted + 1 for prev, r in zip(rounds, rounds[1:]) if r.proposer == "eagle3")


def test_kv_only_catch_up_drafts_what_the_full_layer_drafts(setup, median_entropy):
    target, corpus, _ = setup
    runs = [run_method(target, entropy_method(setup, threshold=median_entropy, kv_only=k), corpus[0][:24]).rounds
            for k in (True, False)]
    assert [(r.proposer, r.accepted) for r in runs[0]] == [(r.proposer, r.accepted) for r in runs[1]]


def test_static_thresholds_pick_one_drafter(setup):
    target, corpus, _ = setup
    for threshold, only in ((-1.0, "eagle3"), (1e9, "dflash")):
        result = assert_lossless(target, entropy_method(setup, threshold=threshold), corpus[0][:24], min_accepted=40)
        assert {r.proposer for r in result.rounds} == {only}


def test_multi_turn_is_lossless(setup, median_entropy):
    target, corpus, _ = setup
    assert_multi_turn_lossless(target, entropy_method(setup, threshold=median_entropy), corpus[1][:24])


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution(setup, median_entropy):
    target, corpus, _ = setup
    small = Eagle3.Options(depth=3, top_k=4, total_token=10)
    make = lambda: entropy_method(setup, threshold=median_entropy, eagle3=small)  # noqa: E731
    assert sampling_p_value(target, make, corpus[0][:24], SAMPLING_TEMPERATURE) > 1e-3


def write_router(folder, hidden: int, threshold: float, seed: int = 0):
    torch.manual_seed(seed)
    Router(hidden).save(folder)
    (folder / "config.json").write_text(json.dumps({"hidden_size": hidden, "threshold": threshold}))
    return folder


def test_neural_router_switches_losslessly_and_needs_its_artifact(setup, tmp_path):
    target, corpus, drafters = setup
    hidden = target.config.hidden_size
    probe = WhiFlashNeural(WhiFlashNeural.Options(**SMALL), loaded(target),
                           {**drafters, "whiflash-neural": str(write_router(tmp_path / "r0", hidden, -1e9))})
    scores = [r.extras["router_score"] for r in run_method(target, probe, corpus[0][:24]).rounds]
    router = write_router(tmp_path / "r1", hidden, statistics.median(scores))
    method = WhiFlashNeural(WhiFlashNeural.Options(**SMALL), loaded(target), {**drafters, "whiflash-neural": str(router)})
    result = assert_lossless(target, method, corpus[0][:24], min_accepted=40)
    assert {r.proposer for r in result.rounds} == {"eagle3", "dflash"}
    with pytest.raises(CheckpointError, match="run `specbench calibrate --method whiflash-neural"):
        WhiFlashNeural(WhiFlashNeural.Options(**SMALL), loaded(target), drafters)
    with pytest.raises(CheckpointError, match="or pass --opt threshold=T"):
        WhiFlashEntropy(WhiFlashEntropy.Options(**SMALL), loaded(target), drafters)


def test_a_calibration_made_with_other_drafters_is_flagged(setup, tmp_path, capsys):
    """Calibration cards name the drafters they were measured with; a run that loads others warns once."""
    target, _, drafters = setup
    prints = {name: fingerprint(Path(ref)) for name, ref in drafters.items()}
    for label, made in (("same", prints), ("other", {**prints, "dflash": "0" * 16})):
        folder = tmp_path / label
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"threshold": 1.0, "drafters": made}))
        WhiFlashEntropy(WhiFlashEntropy.Options(**SMALL), loaded(target), {**drafters, "whiflash-entropy": str(folder)})
        err = capsys.readouterr().err
        assert ("calibrated with another dflash drafter" in err) == (label == "other"), err


def test_switching_sweep_measures_catch_up_against_a_round(setup):
    from specbench_cli.commands.profile import switching_sweep
    from specbench_cli.core.target import Target

    target, _, _ = setup
    method = entropy_method(setup, threshold=0.0)
    frame, clock = switching_sweep(method, Target(target, torch.device("cpu")), [16, 32, 10_000], [1, 8], reps=2, warmup=1)
    assert clock == "perf_counter_ns" and list(frame.kv_len.unique()) == [16, 32]  # past the context: skipped
    # which one is cheaper is a timing, for benchmarks: on a loaded machine a catch-up can outlast a round
    assert (frame.catchup_ms > 0).all() and (frame.round_ms > 0).all()
    assert ((frame.catchup_pct_of_round - 100 * frame.catchup_ms / frame.round_ms).abs() < 0.1).all()
