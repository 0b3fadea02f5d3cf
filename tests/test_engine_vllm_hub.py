"""`--engine vllm` on registered hub models: hub-id targets and hub-id drafters (tests/hub.py's cache of the released
formats, offline), found on our side and handed to vLLM as snapshot folders, with the context and KV cache the
run needs. The speculators-layout drafter is written by speculators in the engine's Python. Without the engine
these tests skip, unless SPECBENCH_REQUIRE_ENGINES=1 (CI), where they fail."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from specbench_cli.models import REVISIONS
from tests.conftest import THREADS
from tests.test_hub_path import cli

pytestmark = [pytest.mark.engine, pytest.mark.slow]
BUDGET = ["--limit", "2", "--max-new-tokens", "12", "--threads", THREADS, "--engine-arg", "enforce_eager=true"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory, engine_python):
    from tests.hub import offline_hub

    with offline_hub(tmp_path_factory, engine_python) as built:
        yield built


def lossless(folder) -> None:
    prompts = pd.read_parquet(folder / "prompts.parquet")
    assert len(prompts) >= 2 and (prompts.replay_checked > 0).all() and (prompts.replay_off == 0).all()


def readme_vllm_lines() -> list[list[str]]:
    """The README's `--engine vllm` command lines (tests/test_hub_path.py runs its others)."""
    import shlex

    from tests.test_docs import README, commands

    return [shlex.split(c) for c in commands(README) if "--engine vllm" in c]


def test_the_readmes_vllm_lines_on_hub_ids(hub, engine_python, tmp_path, monkeypatch):
    """The README's vLLM lines on Llama-3.1-8B and yuhuili's EAGLE-3 (pytorch_model.bin, no rope_theta) by their
    ids: lossless, each checkpoint recorded with its commit, handed to vLLM as its snapshot folder, vLLM sized for
    this run's longest prompt and not the model's 131,072 positions."""
    from tests.test_hub_path import on_the_registered_model

    monkeypatch.chdir(tmp_path)
    lines = readme_vllm_lines()
    assert len(lines) == 2
    for line in lines:
        cli(*on_the_registered_model(line, "llama3.1-8b"), "--engine-python", engine_python,
            "--engine-arg", "enforce_eager=true")
    out = next(tmp_path.glob("results/*baseline*"))  # the first line's list, under its default name
    target, drafter = "meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    for method in ("baseline", "suffix", "eagle3"):
        folder = next(out.parent.glob(f"*/{method}")) if not (out / method).exists() else out / method
        lossless(folder)
        info = json.loads((folder / "run.json").read_text())
        assert info["target_weights"] == f"{target}@{REVISIONS[target]}"
        args = info["engine"]["engine_args"]
        assert args["model"] == str(hub.snapshots[target])  # a folder, never an id vLLM resolves itself
        assert 12 < args["max_model_len"] < 2048 and info["engine"]["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
        if method == "eagle3":
            assert info["drafter_weights"]["eagle3"] == f"{drafter}@{hub.snapshots[drafter].name}"
            assert args["speculative_config"]["model"] == str(hub.snapshots[drafter])


def test_the_speculators_layout_in_both_engines(hub, engine_python, tmp_path):
    """qwen3-8b-think's RedHatAI drafter, as speculators writes it, in our engine and in vLLM."""
    cli("run", "--method", "eagle3", "--model", "qwen3-8b-think", *BUDGET[:-2], "--out", str(tmp_path / "ours"))
    cli("run", "--engine", "vllm", "--engine-python", engine_python, "--method", "eagle3", "--model",
        "qwen3-8b-think", *BUDGET, "--out", str(tmp_path / "vllm"))
    for folder in ("ours", "vllm"):
        lossless(tmp_path / folder)
        info = json.loads((tmp_path / folder / "run.json").read_text())
        repo = "RedHatAI/Qwen3-8B-speculator.eagle3"
        assert info["drafter_weights"]["eagle3"] == f"{repo}@{REVISIONS[repo]}"
