"""The routed methods inside a real vLLM engine (engines/vllm_routed.py: vLLM's EAGLE-3 proposer, subclassed
through the `vllm.general_plugins` entry point): Hybrid Verified Decoding scores the suffix-cache draft first
(engines/vllm_hvd.py); WhiFlash routes between EAGLE-3 and vLLM's own DFlash proposer (engines/vllm_whiflash.py).

At float32 and temperature 0: every routed method in vLLM equals our baseline turn by turn (a two-turn prompt
included); both of its drafters draft and have drafts accepted; every decision follows the method's rule from
what it recorded; and step by step our engine's method, run with what vLLM can run (chains, catch-up every
step), routes as vLLM's does wherever the two saw the same inputs.
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

from tests.helpers import Background
from tests.test_engine_vllm import ENGINE, UNREPLAYED, outputs

pytestmark = [pytest.mark.engine, pytest.mark.embedded]

# summarisation and RAG prompts copy from their context, where the cache draft wins; an MT-Bench prompt gives
# two turns and open-ended text, where EAGLE-3 does
# every output is compared with our baseline's, so no run is replayed (test_engine_vllm.py tests the replay)
SELECTION = ["--model", "smollm2-135m", "--dataset", "spec-bench", "--category", "writing", "--category",
             "summarization", "--category", "rag", "--limit", "4", "--max-new-tokens", "32", "--warmup", "0", "--dtype", "float32",
             "--threads", "1", *UNREPLAYED]
# what vLLM runs of hvd (engines/vllm_methods.py, _hybrid): EAGLE-3 and the suffix draft as chains, catch-up each step
AS_VLLM = ["--opt", "eagle3.top_k=1", "--opt", "suffix.tree=false", "--opt", "lazy_catchup=false"]
# what vLLM runs of whiflash (_whiflash): an EAGLE-3 chain, both drafters catching up every step, EAGLE-3's whole layer
WHIFLASH_AS_VLLM = ["--opt", "eagle3.top_k=1", "--opt", "lazy_catchup=false", "--opt", "kv_only=false"]
WHIFLASH = ("whiflash-entropy", "whiflash-neural")
# thresholds inside the signals these prompts give, so that both drafters draft whatever the committed calibration
# chose (calibrated for bf16 on a CPU, the routers pick DFlash nearly always: docs/drafters.md)
WHIFLASH_THRESHOLD = {"whiflash-entropy": ["--opt", "threshold=2.0"], "whiflash-neural": ["--opt", "threshold=1.1"]}
VLLM = ("hvd", "hvd-freq", *WHIFLASH)
IN_FLIGHT = ("hvd", "whiflash-entropy")


def run(*args: str) -> None:
    result = CliRunner().invoke(app, ["run", *SELECTION, *args])
    assert result.exit_code == 0, result.output


def in_list(method: str, opts: list[str]) -> list[str]:
    """A method's options as a list of methods takes them: each --opt names its method (`--opt hvd.eagle3.top_k=1`)."""
    return [a for opt in opts[1::2] for a in ("--opt", f"{method}.{opt}")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, engine_python, embedded) -> dict[str, Path]:
    """Our baseline and our routed methods run as vLLM runs them, one list on one loaded target in a process of its
    own meanwhile (`Background`); the routed methods in vLLM as two lists of two (an engine each, booted side by
    side); hvd and whiflash-entropy again at two requests in flight."""
    root = tmp_path_factory.mktemp("hvd_runs")
    ours = {"baseline": [], "hvd": AS_VLLM, **{m: [*WHIFLASH_AS_VLLM, *WHIFLASH_THRESHOLD[m]] for m in WHIFLASH}}
    beside = Background("run", *SELECTION, "--method", ",".join(ours),
                        *(a for m, opts in ours.items() for a in in_list(m, opts)), "--out", str(root / "ours"))
    out = {"ours": root / "ours" / "baseline", **{f"ours-{m}": root / "ours" / m for m in ours if m != "baseline"}}
    for methods in (("hvd", "hvd-freq"), WHIFLASH):
        folder = root / f"vllm-{methods[0]}"
        run("--method", ",".join(methods), *ENGINE, "--engine-python", engine_python,
            *(a for m in methods for a in in_list(m, WHIFLASH_THRESHOLD.get(m, []))), "--out", str(folder))
        out |= {f"vllm-{m}": folder / m for m in methods}
    for method in IN_FLIGHT:  # two requests in one engine step: each routed on its own
        out[f"vllm-{method}-c2"] = root / f"vllm-{method}-c2"
        run("--method", method, *ENGINE, *WHIFLASH_THRESHOLD.get(method, []), "--engine-python", engine_python,
            "--concurrency", "2", "--out", str(out[f"vllm-{method}-c2"]))
    beside.wait()
    return out


def features(rounds: pd.DataFrame) -> np.ndarray:
    return np.array([[float(v) for v in f.split(",")] for f in rounds.features])


@pytest.mark.slow
@pytest.mark.parametrize("method", [*(f"vllm-{m}" for m in VLLM), *(f"vllm-{m}-c2" for m in IN_FLIGHT),
                                    "ours-hvd", *(f"ours-{m}" for m in WHIFLASH)])
def test_routed_outputs_equal_our_baseline_turn_by_turn(runs, method):
    ours, theirs = outputs(runs["ours"]), outputs(runs[method])
    assert set(ours) == set(theirs) and any(turn == 1 for _, turn in ours)
    for key, (prompt_ids, output_ids) in ours.items():
        assert theirs[key] == (prompt_ids, output_ids), f"{method} {key}: output differs from our baseline"


@pytest.mark.slow
@pytest.mark.parametrize("method", ["hvd", *WHIFLASH])
def test_vllm_rows_record_the_columns_ours_record(runs, method):
    """One policy per router (methods/router_policies.py) writes one set of extras in both engines; vLLM's idle
    drafter runs its first forward every step, so its backlog is 0 there."""
    ours = pd.read_parquet(runs[f"ours-{method}"] / "rounds.parquet")
    theirs = pd.read_parquet(runs[f"vllm-{method}"] / "rounds.parquet")
    signals = {"backlog", "router_score", *(("features",) if method == "hvd" else ("entropy",))}
    assert signals <= set(ours.columns) and signals <= set(theirs.columns)
    assert (theirs.backlog == 0).all() and (ours.backlog >= 0).all()


@pytest.mark.slow
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


@pytest.mark.slow
def test_vllms_decisions_follow_the_rule_with_our_predictor(runs):
    """Each step's recorded features, scored by the predictor our engine loads, give vLLM's score and choice."""
    from specbench_methods.predictors import PayoffPredictor

    info = json.loads((runs["vllm-hvd"] / "run.json").read_text())
    settings = info["settings"]["engine_proposer"]
    predictor, _ = PayoffPredictor.load(Path(settings["predictor"]))
    rounds = pd.read_parquet(runs["vllm-hvd"] / "rounds.parquet")
    with torch.inference_mode():
        scores = predictor(torch.from_numpy(features(rounds)).float()).numpy()
    assert np.allclose(scores, rounds.router_score, atol=1e-5)
    drafted = features(rounds)[:, 2] > 0
    assert ((rounds.proposer == "suffix") == (drafted & (scores >= settings["threshold"]))).all()


@pytest.mark.slow
def test_hvd_freq_in_vllm_routes_by_the_suffix_score(runs):
    rounds = pd.read_parquet(runs["vllm-hvd-freq"] / "rounds.parquet")
    x = features(rounds)
    assert np.allclose(rounds.router_score, x[:, 0], atol=1e-6)
    assert ((rounds.proposer == "suffix") == ((x[:, 2] > 0) & (x[:, 0] >= 8))).all()  # τ = eagle3.depth


@pytest.mark.slow
def test_our_hvd_routes_as_vllm_at_every_step(runs):
    """Step by step: the same features (our suffix cache drafts what ArcticInference's drafts, ties included), the
    same score, the same choice, the same accepted count."""
    theirs = pd.read_parquet(runs["vllm-hvd"] / "rounds.parquet")
    ours = pd.read_parquet(runs["ours-hvd"] / "rounds.parquet")
    both = theirs.merge(ours, on=["prompt_id", "turn", "round"], suffixes=("_vllm", "_ours"))
    assert len(both) == len(theirs) == len(ours)
    assert np.allclose(features(both.rename(columns={"features_vllm": "features"})),
                       features(both.rename(columns={"features_ours": "features"})), atol=1e-5)
    assert (both.proposer_vllm == both.proposer_ours).all() and (both.accepted_vllm == both.accepted_ours).all()
    assert np.allclose(both.router_score_vllm, both.router_score_ours, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["whiflash-entropy", "whiflash-neural"])
def test_whiflash_in_vllm_drafts_with_both_and_follows_its_rule(runs, method):
    rounds = pd.read_parquet(runs[f"vllm-{method}"] / "rounds.parquet")
    assert set(rounds.proposer) == {"eagle3", "dflash"}
    for source in ("eagle3", "dflash"):
        assert (rounds[rounds.proposer == source].accepted > 0).any(), source
    info = json.loads((runs[f"vllm-{method}"] / "run.json").read_text())
    policy = info["settings"]["engine_proposer"]["policy"]
    eagle = rounds.proposer == "eagle3"
    if method == "whiflash-neural":
        assert (eagle == (rounds.router_score > policy["threshold"])).all()
    else:
        threshold = rounds.category.map(lambda c: policy["thresholds"].get(c, policy["threshold"]))
        assert ((rounds.proposer == "eagle3") == (rounds.entropy > threshold)).all()


@pytest.mark.slow
@pytest.mark.parametrize("method, signal", [("whiflash-entropy", "entropy"), ("whiflash-neural", "router_score")])
def test_our_whiflash_routes_as_vllm_at_every_step(runs, method, signal):
    """The entropy policy reads the target's logits at the newest committed position (vLLM recomputes them from the
    step's final hidden state), the neural one the last layer's output there (vLLM's auxiliary hidden state). Same
    signal (to float32 noise), same choices, same accepted counts."""
    theirs = pd.read_parquet(runs[f"vllm-{method}"] / "rounds.parquet")
    ours = pd.read_parquet(runs[f"ours-{method}"] / "rounds.parquet")
    both = theirs.merge(ours, on=["prompt_id", "turn", "round"], suffixes=("_vllm", "_ours"))
    assert len(both) == len(theirs) == len(ours)
    assert np.allclose(both[f"{signal}_vllm"], both[f"{signal}_ours"], atol=1e-3)
    assert (both.proposer_vllm == both.proposer_ours).all()
    assert (both.accepted_vllm == both.accepted_ours).all()


def test_a_routed_method_in_an_engine_without_the_plugin_is_one_line_before_it_starts(tmp_path):
    """Our own Python imports no vLLM plugin of ours (it has no vLLM at all): refused before any engine starts."""
    import sys

    result = CliRunner().invoke(app, ["run", *SELECTION, "--method", "hvd", *ENGINE, "--engine-python", sys.executable,
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "lacks" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
