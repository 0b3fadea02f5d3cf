"""Trace replay agrees with reality: a live greedy fp32 run of a drafter accepts, round by round, exactly
what replay predicts at the round's start position, so replay's static path is the live run. Checked for a
tree (EAGLE-3), a chain (DFlash), a feature-free drafter (PLD) and a cross-prompt one (suffix), on a tiny
target whose distilled drafters accept often."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specbench_methods.pld import PromptLookup
from specbench_methods.suffix import Suffix
from specbench_cli.analysis.oracles import best_rounds, static_rounds
from specbench_cli.commands.oracle.replay import Trace, replay_turn
from specbench_cli.core.target import Target
from specbench_cli.core.tree import DraftTree
from tests.drafter_fixtures import make_method
from tests.helpers import run_method


def test_matched_walks_the_tree_like_greedy_accept():
    tree = DraftTree([5, 6, 7, 8, 9], [0, 1, 1, 0, 4])  # root -> 5 -> {6, 7}; root -> 8 -> 9
    assert tree.matched([5, 7, 1]) == 2 and tree.matched([8, 9]) == 2 and tree.matched([4]) == 0
    assert DraftTree.chain([1, 2, 3]).matched([1, 2]) == 2


def makers(distilled):
    target, corpus, eagle3 = distilled("eagle3", "llama")
    _, _, dflash = distilled("dflash", "llama")
    return target, corpus, {
        "eagle3": lambda: make_method("eagle3", target, eagle3, depth=4, top_k=4, total_token=16),
        "dflash": lambda: make_method("dflash", target, dflash, block_size=4),
        "pld": lambda: PromptLookup(PromptLookup.Options(), None),
        "suffix": lambda: Suffix(Suffix.Options(), None),
    }


@pytest.mark.parametrize("name", ["eagle3", "dflash", "pld", "suffix"])
def test_replay_equals_live(distilled, name):
    target, corpus, make = makers(distilled)
    prompt = corpus[2][:24]
    live = run_method(target, make[name](), prompt, max_new=100)
    trace = Trace("p", 0, "c", "s", prompt, live.output_ids)
    predicted = replay_turn(Target(target, torch.device("cpu")), {name: make[name]()}, trace).walks[name].accepted
    assert len(predicted) == len(live.output_ids) - 1
    t = 0
    for r in live.rounds[:-1]:  # the last round may be cut by the token budget
        assert predicted[t] == r.accepted, f"round starting at {t}"
        t += r.emitted
    assert static_rounds(np.array(predicted)) == len(live.rounds)
    if name != "pld":
        assert sum(r.accepted for r in live.rounds) > 20  # the drafter really accepts: the check has teeth


def test_replay_signals_and_oracle_bound(distilled):
    target, corpus, make = makers(distilled)
    prompt = corpus[3][:24]
    live = run_method(target, make["pld"](), prompt, max_new=80)
    trace = Trace("p", 0, "c", "s", prompt, live.output_ids)
    r = replay_turn(Target(target, torch.device("cpu")), {n: make[n]() for n in ("eagle3", "dflash")}, trace)
    T = len(live.output_ids) - 1
    assert r.entropy.shape == (T,) and r.hidden.shape == (T, target.config.hidden_size)
    assert torch.isfinite(r.entropy).all() and (r.entropy >= 0).all()
    al = np.array([r.walks["eagle3"].accepted, r.walks["dflash"].accepted])
    assert best_rounds(al) <= min(static_rounds(al[0]), static_rounds(al[1]))


def test_cold_drafts_run_a_target_forward_before_each_round_start_and_change_no_walk(distilled):
    """`tune`'s replay times each round start after a forward of the target (its weights out of cache as in a live
    round) and once per round start; the walks stay what they were (the forward writes past the teacher-forced
    sequence, whose rows the drafter reads)."""
    from specbench_cli.analysis.oracles import round_starts

    target, corpus, make = makers(distilled)
    prompt = corpus[2][:24]
    live = run_method(target, make["eagle3"](), prompt, max_new=60)
    trace = Trace("p", 0, "c", "s", prompt, live.output_ids)
    hot = replay_turn(Target(target, torch.device("cpu")), {"eagle3": make["eagle3"]()}, trace).walks["eagle3"]
    cold_target = Target(target, torch.device("cpu"))
    forwards = []
    verify = cold_target.verify
    cold_target.verify = lambda *args, **kwargs: forwards.append(1) or verify(*args, **kwargs)
    cold = replay_turn(cold_target, {"eagle3": make["eagle3"]()}, trace, cold_drafts=True).walks["eagle3"]
    assert (cold.accepted, cold.drafted, cold.branched) == (hot.accepted, hot.drafted, hot.branched)
    assert len(forwards) == len(round_starts(np.array(cold.accepted))) > 1
