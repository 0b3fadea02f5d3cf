"""Hybrid Verified Decoding inside a real vLLM engine (engines/vllm_hvd.py: vLLM's EAGLE-3 proposer, subclassed
through the `vllm.general_plugins` entry point to score the suffix-cache draft first).

At float32 and temperature 0: `hvd` and `hvd-freq` in vLLM equal our baseline turn by turn (a two-turn prompt
included); both proposers draft and have drafts accepted; every decision follows the paper's rule from its
recorded features with our own predictor; and step by step our engine's `hvd`, run with what vLLM can run
(chains), routes as vLLM's does wherever the two saw the same features.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from specbench_cli.cli import app

from tests.test_engine_vllm import ENGINE, outputs

pytestmark = [pytest.mark.engine, pytest.mark.embedded]

# summarisation and RAG prompts copy from their context, where the cache draft wins; an MT-Bench prompt gives
# two turns and open-ended text, where EAGLE-3 does
SELECTION = ["--model", "smollm2-135m", "--dataset", "spec-bench", "--category", "writing", "--category",
             "summarization", "--category", "rag", "--limit", "4", "--max-new-tokens", "48", "--dtype", "float32",
             "--threads", "1"]
# what vLLM runs of hvd (engines/vllm_methods.py, _hybrid): EAGLE-3 and the suffix draft as chains, catch-up each step
AS_VLLM = ["--opt", "eagle3.top_k=1", "--opt", "suffix.tree=false", "--opt", "lazy_catchup=false"]


def run(*args: str) -> None:
    result = CliRunner().invoke(app, ["run", *SELECTION, *args])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def runs(tmp_path_factory, engine_python, embedded) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hvd_runs")
    out = {name: root / name for name in ("ours", "ours-hvd", "vllm-hvd", "vllm-hvd-freq")}
    run("--method", "baseline", "--out", str(out["ours"]))
    run("--method", "hvd", *AS_VLLM, "--out", str(out["ours-hvd"]))
    for method in ("hvd", "hvd-freq"):
        run("--method", method, *ENGINE, "--engine-python", engine_python, "--out", str(out[f"vllm-{method}"]))
    return out


def features(rounds: pd.DataFrame) -> np.ndarray:
    return np.array([[float(v) for v in f.split(",")] for f in rounds.features])


@pytest.mark.parametrize("method", ["vllm-hvd", "vllm-hvd-freq", "ours-hvd"])
def test_hvd_outputs_equal_our_baseline_turn_by_turn(runs, method):
    ours, theirs = outputs(runs["ours"]), outputs(runs[method])
    assert set(ours) == set(theirs) and any(turn == 1 for _, turn in ours)
    for key, (prompt_ids, output_ids) in ours.items():
        assert theirs[key] == (prompt_ids, output_ids), f"{method} {key}: output differs from our baseline"


def test_both_proposers_draft_and_win_somewhere_inside_vllm(runs):
    rounds = pd.read_parquet(runs["vllm-hvd"] / "rounds.parquet")
    assert set(rounds.proposer) == {"suffix", "eagle3"}
    for source in ("suffix", "eagle3"):
        chosen = rounds[rounds.proposer == source]
        assert (chosen.tree_size > 0).all() and (chosen.accepted > 0).any(), source
    info = json.loads((runs["vllm-hvd"] / "run.json").read_text())
    proposer = info["settings"]["engine_proposer"]
    assert proposer["threshold"] == 6.0 and proposer["eagle_k"] == 9 and proposer["predictor"]
    assert info["settings"]["speculative_config"]["num_speculative_tokens"] == 64  # the suffix cap, above the chain


def test_vllms_decisions_follow_the_rule_with_our_predictor(runs):
    """Each step's recorded features, scored by the predictor our engine loads, give vLLM's score and choice."""
    from methods.predictors import PayoffPredictor

    info = json.loads((runs["vllm-hvd"] / "run.json").read_text())
    settings = info["settings"]["engine_proposer"]
    predictor, _ = PayoffPredictor.load(Path(settings["predictor"]))
    rounds = pd.read_parquet(runs["vllm-hvd"] / "rounds.parquet")
    with torch.inference_mode():
        scores = predictor(torch.from_numpy(features(rounds)).float()).numpy()
    assert np.allclose(scores, rounds.router_score, atol=1e-5)
    drafted = features(rounds)[:, 2] > 0
    assert ((rounds.proposer == "suffix") == (drafted & (scores >= settings["threshold"]))).all()


def test_hvd_freq_in_vllm_routes_by_the_suffix_score(runs):
    rounds = pd.read_parquet(runs["vllm-hvd-freq"] / "rounds.parquet")
    x = features(rounds)
    assert np.allclose(rounds.router_score, x[:, 0], atol=1e-6)
    assert ((rounds.proposer == "suffix") == ((x[:, 2] > 0) & (x[:, 0] >= 8))).all()  # τ = eagle3.depth


def test_our_engine_routes_as_vllm_wherever_both_saw_the_same_features(runs):
    """Step by step. Where the features differ the two suffix caches drafted different tokens of equal score
    (a tie between equally frequent continuations, broken otherwise by ArcticInference); such steps are few."""
    theirs = pd.read_parquet(runs["vllm-hvd"] / "rounds.parquet")
    ours = pd.read_parquet(runs["ours-hvd"] / "rounds.parquet")
    key = ["prompt_id", "turn", "round"]
    both = theirs.merge(ours, on=key, suffixes=("_vllm", "_ours"))
    assert len(both) == len(theirs) == len(ours)
    same = np.isclose(features(both.rename(columns={"features_vllm": "features"})),
                      features(both.rename(columns={"features_ours": "features"})), atol=1e-5).all(1)
    assert same.mean() > 0.8, f"only {same.sum()} of {len(same)} steps saw the same features"
    agree = both[same]
    assert (agree.proposer_vllm == agree.proposer_ours).all()
    assert np.allclose(agree.router_score_vllm, agree.router_score_ours, atol=1e-4)
    whole_turns = pd.Series(same, index=both.index).groupby([both.prompt_id, both.turn]).all()
    assert whole_turns.any()  # at least one turn saw the same features from its first step to its last
