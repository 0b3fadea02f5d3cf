"""`--target random:NAME[:SEED]`: a registered architecture with weights drawn from a seed."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specbench_cli.cli import app
from specbench_cli.core.errors import UsageError
from specbench_cli.models import ARCHITECTURES, RandomWeights, get_model_spec, parse_random, random_architectures
from specbench_cli.random_weights import build, draw
from tests.conftest import needs_embedded, tiny_model

# Parameters the authors' model cards state (Qwen3 cards: "Number of Parameters"; Llama 3.1: 8.03 B).
PUBLISHED = {"qwen3-0.6b": 0.6e9, "qwen3-1.7b": 1.7e9, "qwen3-4b": 4.0e9, "qwen3-8b": 8.2e9, "llama3.1-8b": 8.03e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_shipped_architecture_has_its_published_size(name):
    model = build(RandomWeights(name), torch.device("meta"), torch.bfloat16)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count / PUBLISHED[name] - 1) < 0.05, f"{name}: {count / 1e9:.3f} B parameters"
    assert type(model).__name__ == json.loads((ARCHITECTURES / name / "config.json").read_text())["architectures"][0]


def test_the_same_seed_draws_the_same_weights_and_another_seed_others():
    a, b, c = (tiny_model("llama", layers=2) for _ in range(3))
    draw(a, 7, 0.02), draw(b, 7, 0.02), draw(c, 8, 0.02)
    same = [torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values())]
    assert all(same)
    matrices = [k for k, v in a.state_dict().items() if v.dim() > 1]
    assert not any(torch.equal(a.state_dict()[k], c.state_dict()[k]) for k in matrices)
    norms = [v for k, v in a.state_dict().items() if "norm" in k]
    assert norms and all((v == 1).all() for v in norms)
    weight = a.state_dict()[matrices[0]]
    assert abs(weight.std().item() - 0.02) < 0.002  # the architecture's initializer_range


def test_spellings_and_bad_input():
    assert parse_random("random:qwen3-8b") == RandomWeights("qwen3-8b", 0)
    assert parse_random("random:llama3.1-8b:12") == RandomWeights("llama3.1-8b", 12)
    assert parse_random("Qwen/Qwen3-8B") is None
    assert set(PUBLISHED) <= set(random_architectures())
    spec = get_model_spec("smollm2-135m", "random:qwen3-1.7b:3")
    assert (spec.name, spec.target, spec.drafters) == ("random:qwen3-1.7b", "random:qwen3-1.7b:3", {})
    for ref, says in (("random:qwen3-70b", "qwen3-70b"), ("random:qwen3-8b:x", "whole number")):
        with pytest.raises(UsageError, match=says):
            parse_random(ref)
    with pytest.raises(UsageError, match="names another model"):
        get_model_spec("llama3.1-8b", "random:qwen3-8b")


@pytest.mark.parametrize("args, says", [
    (["--target", "random:nosuch"], "nosuch"),
    (["--model", "qwen3-4b", "--target", "random:qwen3-8b"], "names another model"),
    (["--target", "random:qwen3-8b", "--method", "eagle3"], "random target weights"),
    (["--target", "random:qwen3-8b", "--engine", "vllm"], "checkpoint folder"),
])
def test_bad_random_targets_exit_2_in_one_line_before_anything_is_built(tmp_path, args, says):
    result = CliRunner().invoke(app, ["run", "--limit", "1", "--out", str(tmp_path / "r"), *args])
    assert result.exit_code == 2 and says in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


@pytest.mark.slow
@needs_embedded
def test_a_run_on_random_weights_says_so(tmp_path):
    result = CliRunner().invoke(app, ["run", "--target", "random:smollm2-135m:5", "--limit", "1", "--warmup", "0",
                                      "--max-new-tokens", "6", "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert info["settings"]["model"] == "random:smollm2-135m" and info["settings"]["target"] == "random:smollm2-135m:5"
    assert info["random_weights"]["seed"] == 5
    assert "random weights of smollm2-135m (seed 5)" in (tmp_path / "r" / "summary.md").read_text()
    assert "(of the same random weights)" in result.output
