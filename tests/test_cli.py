"""Bad input ends in one clear line and exit code 2, before any model loads."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specbench_cli.cli import app

BAD = [
    (["run", "--method", "sufix"], "did you mean 'suffix'"),
    (["run", "--model", "qwen3-9b"], "unknown model 'qwen3-9b'"),
    (["run", "--dataset", "spec_bench"], "did you mean 'spec-bench'"),
    (["run", "--category", "writng"], "did you mean 'writing'"),
    (["run", "--method", "suffix", "--opt", "max_depth"], "malformed --opt"),
    (["run", "--method", "suffix", "--opt", "min_token_prb=0.2"], "did you mean 'min_token_prob'"),
    (["run", "--method", "suffix", "--opt", "max_depth=deep"], "not a int"),
    (["run", "--method", "baseline", "--opt", "k=1"], "takes no --opt"),
    (["run", "--target", "./no/such/checkpoint"], "target checkpoint not found"),
    (["run", "--drafter", "eagle3=/no/such"], "has no drafter 'eagle3'"),
    (["run", "--method", "confu", "--model", "qwen3-8b"], "no confu drafter is registered for model qwen3-8b"),
    (["run", "--method", "dart", "--model", "llama3.1-8b"], "DART publishes drafters and tries for Qwen3 only"),
    (["run", "--method", "eagle3", "--drafter", "eagle3=./missing/folder"], "drafter checkpoint not found"),
    (["run", "--shard", "3/2"], "bad --shard"),
    (["run", "--dataset", "missing.jsonl"], "dataset file not found"),
    (["run", "--max-new-tokens", "0"], "at least 1"),
    (["run", "--dtype", "float8"], "unknown dtype"),
    (["run", "--device", "split"], "CUDA is not available"),
    (["train-drafter", "--method", "suffix"], "no training recipe for it"),
    (["train-drafter", "--method", "dart", "--model", "qwen3-9b"], "unknown model 'qwen3-9b'"),
    (["profile"], "choose one of --phases, --component head or --switching"),
    (["profile", "--component", "head", "--method", "eagle3"], "use --method flashhead"),
    (["profile", "--component", "lm"], "unknown --component 'lm'"),
    (["profile", "--switching", "--method", "eagle3"], "use --method whiflash-entropy"),
    (["calibrate", "--method", "hvd-freq"], "calibrate knows whiflash-entropy, whiflash-neural, hvd"),
    (["calibrate", "--model", "qwen3-9b"], "unknown model 'qwen3-9b'"),
    (["oracle", "--drafters", "confu"], "confu cannot be replayed"),
    (["oracle", "--drafters", "eagle3", "--opt", "depth=3"], "malformed --opt 'depth=3'"),
    (["run", "--method", "whiflash-neural", "--model", "qwen3-8b"], "no whiflash-neural drafter is registered"),
    (["run", "--method", "hvd", "--model", "qwen3-8b"], "no hvd drafter is registered"),
    (["profile", "--phases", "--method", "sufix"], "did you mean 'suffix'"),
    (["report", "no/such/results"], "results directory not found"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.output


def test_existing_results_dir_is_not_overwritten(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    result = CliRunner().invoke(app, ["run", "--out", str(out)])
    assert result.exit_code == 2 and "--resume" in result.output
    result = CliRunner().invoke(app, ["run", "--out", str(tmp_path / "none"), "--resume"])
    assert result.exit_code == 2 and "no run to continue" in result.output


def test_list_and_help_document_defaults():
    result = CliRunner().invoke(app, ["run", "--list"])
    assert result.exit_code == 0 and "suffix" in result.output and "max_depth=64" in result.output
    helptext = CliRunner().invoke(app, ["run", "--help"]).output
    for option in ("--method", "--shard", "--warmup", "--resume", "--opt", "--drafter", "--target", "[default: 1024]"):
        assert option in helptext
