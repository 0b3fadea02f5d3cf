"""Bad input ends in one clear line and exit code 2, before any model loads.

One table holds every bad input and the message it gets; the files some of them name are written by
`bad_files` into the test's working folder, and loading a model during any of them fails the test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbench_cli.cli import app
from tests.fake_runs import Turn, write_run

BAD = [
    (["run", "--method", "sufix"], "did you mean 'suffix'"),
    (["run", "--engine", "vlm"], "did you mean 'vllm'"),
    (["run", "--engine", "vllm", "--concurrency", "0"], "expected distinct positive whole numbers"),
    (["run", "--engine", "vllm", "--concurrency", "many"], "expected distinct positive whole numbers"),
    (["run", "--engine", "vllm", "--concurrency", "1,2,2"], "expected distinct positive whole numbers"),
    (["run", "--engine", "vllm", "--method", "dart"], "--engine vllm runs baseline, pld, suffix, eagle3, dflash, sps, hvd, hvd-freq, whiflash-entropy, whiflash-neural; not dart"),
    (["run", "--engine", "vllm", "--engine-arg", "tensor_parallel_size"], "malformed --engine-arg"),
    (["run", "--engine", "vllm", "--engine-arg", "model=x"], "may not set model"),
    (["run", "--engine", "vllm", "--compile"], "--compile is our engine's"),
    (["run", "--device", "split", "--compile"], "--compile runs on one device"),
    (["run", "--concurrency", "4"], "--concurrency is not --engine specbench's"),
    (["run", "--engine-arg", "seed=1"], "are for --engine vllm"),
    (["run", "--engine-url", "http://localhost:8000"], "are for --engine vllm"),
    (["run", "--engine", "vllm", "--engine-url", "localhost:8000"], "expected http://HOST:PORT"),
    (["run", "--engine", "vllm", "--engine-url", "http://localhost:8000", "--engine-arg", "seed=1"], "drop --engine-serve"),
    (["run", "--engine", "vllm", "--engine-python", "/no/python"], "/no/python does not exist"),
    # (any Python stands in for the engine's: the option is refused before the engine starts)
    (["run", "--engine", "vllm", "--engine-python", sys.executable, "--method", "eagle3", "--opt", "top_k=4"],
     "vLLM's EAGLE-3 drafts a chain"),
    (["run", "--engine", "vllm", "--engine-python", sys.executable, "--method", "suffix", "--opt", "tree=true"],
     "one path"),
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
    # numbers out of range (issue 16)
    (["run", "--temperature", "nan"], "--temperature must be a finite number"),
    (["run", "--temperature", "-1"], "--temperature must be at least 0"),
    (["run", "--threads", "-1"], "--threads must be at least 1"),
    (["run", "--threads", "0"], "--threads must be at least 1"),
    (["run", "--limit", "-478"], "--limit must be at least 1"),
    (["run", "--warmup", "-1"], "--warmup must be at least 0"),
    (["calibrate", "--prompts", "-1"], "--prompts must be at least 1"),
    (["calibrate", "--prompts", "0"], "--prompts must be at least 1"),
    (["calibrate", "--steps", "0"], "--steps must be at least 1"),
    # defaults write into the project's drafters folder, wherever the command runs (here: a temporary folder)
    (["calibrate", "--method", "whiflash-entropy"], "drafters/smollm2-135m/whiflash-entropy exists; pass --overwrite"),
    (["train-drafter", "--method", "eagle3"], "drafters/smollm2-135m/eagle3 exists; pass --resume"),
    (["profile", "--component", "head", "--method", "flashhead", "--reps", "0"], "--reps must be at least 1"),
    (["train-drafter", "--steps", "-5"], "--steps must be at least 1"),
    (["train-drafter", "--minutes", "-1"], "--minutes must be at least 0"),
    (["train-drafter", "--eval-every", "0"], "--eval-every must be at least 1"),
    (["train-drafter", "--steps", "100", "--anneal", "101"], "--anneal must be at most --steps (100)"),
    (["train-drafter", "--method", "dflash", "--opt", "dflash.block_size=1"], "--opt dflash.block_size=1 is out of range for dflash's recipe"),
    (["train-drafter", "--method", "dflash", "--opt", "eagle3.ttt=2"], "malformed --opt 'eagle3.ttt=2': expected dflash.KEY=VALUE"),
    (["train-drafter", "--method", "eagle3", "--opt", "eagle3.ttt=x"], "bad value for --opt eagle3.ttt: 'x' is not a int"),
    (["train-drafter", "--method", "dart", "--ttt", "0"], "--opt dart.ttt=0 is out of range"),
    (["train-drafter", "--resume", "--out", "no/such/drafter"], "no training to continue"),
    (["report", "fake", "--compare", "fake", "--max-regression", "-5"], "--max-regression must be at least 0"),
    (["report", "fake", "--along", "nosuch"], "unknown method label for --along 'nosuch'"),
    # method options out of range, refused before the model loads
    (["run", "--method", "suffix", "--opt", "max_depth=-5"], "max_depth=-5 is out of range for suffix"),
    (["run", "--method", "suffix", "--opt", "min_token_prob=7"], "min_token_prob=7 is out of range"),
    (["run", "--method", "suffix", "--opt", "max_spec_factor=1e9"], "max_spec_factor=1e+09 is out of range"),
    (["run", "--method", "eagle3", "--opt", "top_k=0"], "top_k=0 is out of range for eagle3"),
    (["run", "--method", "dflash", "--opt", "block_size=1"], "block_size=1 drafts nothing"),
    (["run", "--method", "pld", "--opt", "min_ngram=5"], "min_ngram=5 is above max_ngram=3"),
    (["run", "--method", "hvd", "--opt", "threshold=inf"], "threshold=inf is out of range for hvd"),
    # a routed method's proposers' options: each parsed and range-checked by the proposer's own Options
    (["run", "--method", "whiflash-entropy", "--opt", "eagle3.top_k=0"], "eagle3.top_k=0 is out of range for whiflash-entropy"),
    (["run", "--method", "whiflash-entropy", "--opt", "dflash.block_size=1"], "block_size=1 drafts nothing"),
    (["run", "--method", "hvd", "--opt", "suffix.max_depth=-5"], "suffix.max_depth=-5 is out of range for hvd"),
    (["run", "--method", "hvd", "--opt", "eagle3.nosuch=1"], "unknown option for hvd 'eagle3.nosuch'"),
    (["run", "--method", "hvd", "--opt", "eagle3.depth=x"], "bad value for --opt eagle3.depth: 'x' is not a int"),
    # checkpoints that cannot be loaded
    (["run", "--model", "mine", "--target", "empty"], "target checkpoint folder"),
    (["run", "--model", "mine", "--target", "no_config"], "has no config.json"),
    (["run", "--method", "eagle3", "--drafter", "eagle3=random_bytes"], "not a safetensors file"),
    (["run", "--method", "eagle3", "--drafter", "eagle3=truncated"], "truncated"),
    # results folders that cannot be written
    (["run", "--out", "/proc/specbench"], "cannot create results directory"),
    (["run", "--out", "/dev/null/x"], "cannot create results directory"),
    (["report", "fake", "--out", "a_file"], "is a file"),
    (["report", "fake", "--export", "spec-bench", "a_file"], "--export spec-bench a_file: it is a file; name a folder"),
    # dataset files
    (["run", "--dataset", "rows_list.jsonl"], "rows_list.jsonl:1: each line must be a JSON object"),
    (["run", "--dataset", "rows_str.jsonl"], "rows_str.jsonl:2: each line must be a JSON object"),
    (["run", "--dataset", "latin1.jsonl"], "not UTF-8 text"),
    (["run", "--dataset", "folder.jsonl"], "it is a directory"),
    (["run", "--dataset", "turns_str.jsonl"], "'turns' must be a list of strings"),
    (["run", "--dataset", "turns_empty.jsonl"], "turn 1 is empty"),
    (["run", "--dataset", "duplicate.jsonl"], "id 'a' appears twice"),
    # results the report cannot read
    (["report", "not_json"], "not a readable run.json"),
    (["report", "no_settings"], "has no 'settings'"),
    # a sweep whose [run] value has the wrong type
    (["sweep", "limit.toml"], "[run] limit = 'many' must be an integer"),
    # paired runs (issue 50): a comma list of methods and --repeat
    (["run", "--method", "suffix,suffix"], "names suffix more than once; only baseline may appear twice"),
    (["run", "--method", "baseline,baseline,baseline"], "names baseline more than once"),
    (["run", "--method", "baseline,,suffix"], "an empty name in the list"),
    (["run", "--method", "baseline,sufix"], "did you mean 'suffix'"),
    (["run", "--repeat", "0"], "--repeat must be at least 1"),
    (["run", "--repeat", "-2"], "--repeat must be at least 1"),
    (["run", "--repeat", "100000000000"], "--repeat 100000000000: at most 1000 passes"),
    (["run", "--method", "baseline,eagle3", "--opt", "suffix.max_spec_tokens=3"],
     "--opt suffix.max_spec_tokens=3: suffix is not in the list (baseline, eagle3)"),
    (["run", "--method", "baseline,eagle3", "--opt", "depth=4"], "each --opt names its method first, e.g. --opt eagle3.KEY=VALUE"),
    (["run", "--method", "baseline,eagle3", "--opt", "eagle3.top_k=0"], "top_k=0 is out of range for eagle3"),
    (["run", "--method", "baseline,suffix", "--drafter", "eagle3=x"], "none of baseline, suffix takes a drafter named 'eagle3'"),
    (["run", "--method", "baseline,suffix", "--engine", "vllm", "--engine-url", "http://localhost:1"], "a vLLM server runs one method"),
    (["run", "--method", "baseline,suffix", "--engine", "vllm", "--concurrency", "2"], "a comma list of methods and --repeat run one sequence at a time"),
    (["run", "--method", "baseline,suffix", "--batch-size", "2"], "run each --batch-size or --concurrency level on its own"),
    (["run", "--batch-size", "1,,2"], "--batch-size '1,,2': expected distinct positive whole numbers"),
    (["run", "--method", "baseline,suffix", "--out", "fake"], "results directory fake/baseline exists"),
]


@pytest.fixture(autouse=True)
def bad_files(tmp_path, monkeypatch):
    """The files the table names, in the working folder; loading any model fails the test."""
    monkeypatch.chdir(tmp_path)

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded for bad input")

    import specbench_cli.loading
    import specbench_cli.planning

    monkeypatch.setattr(specbench_cli.loading, "load_model", no_model)
    monkeypatch.setattr(specbench_cli.planning, "load_model", no_model)
    (tmp_path / "empty").mkdir()
    (tmp_path / "no_config").mkdir()
    (tmp_path / "no_config" / "model.safetensors").write_bytes(_safetensors())
    for name, data in (("random_bytes", bytes(range(256)) * 40), ("truncated", _safetensors()[:-7])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        (tmp_path / name / "model.safetensors").write_bytes(data)
    rows = {"rows_list": "[1, 2]\n", "rows_str": '{"turns": ["fine"]}\n"hello"\n', "turns_str": '{"turns": "Hello"}\n',
            "turns_empty": '{"turns": [""]}\n', "duplicate": '{"id": "a", "turns": ["x"]}\n{"id": "a", "turns": ["y"]}\n'}
    for name, text in rows.items():
        (tmp_path / f"{name}.jsonl").write_text(text)
    (tmp_path / "latin1.jsonl").write_bytes('{"turns": ["caf\u00e9"]}\n'.encode("latin-1"))
    (tmp_path / "folder.jsonl").mkdir()
    write_run(tmp_path / "fake" / "baseline", "baseline", [Turn("p0", "qa", [0, 0], 10.0, depth=0)])
    (tmp_path / "a_file").write_text("x")
    for name, text in (("not_json", "{oops"), ("no_settings", "{}")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(text)
    (tmp_path / "limit.toml").write_text('models = ["smollm2-135m"]\ndatasets = ["spec-bench"]\nmethods = ["baseline"]\n'
                                          '[run]\nlimit = "many"\n')


def _safetensors() -> bytes:
    """A real safetensors file of one float32 tensor of 4 values."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    return len(header).to_bytes(8, "little") + header + bytes(16)


def test_a_repeat_that_is_not_a_number_is_refused():
    result = CliRunner().invoke(app, ["run", "--repeat", "x"])
    assert result.exit_code == 2 and "Invalid value for '--repeat'" in result.output


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.output


def test_an_unreachable_engine_url_is_said_after_a_bounded_wait(tmp_path, monkeypatch):
    import socket

    from specbench_cli.engines import vllm_server

    monkeypatch.setattr(vllm_server, "HEALTH_WAIT_S", 1.0)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = CliRunner().invoke(app, ["run", "--engine", "vllm", "--engine-url", f"http://127.0.0.1:{port}",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and f"no vLLM server answered at http://127.0.0.1:{port}/health within 1 s" in result.output
    assert not (tmp_path / "run").exists()


def test_every_concurrency_level_is_checked_before_the_first_runs(tmp_path):
    (tmp_path / "sweep" / "c4").mkdir(parents=True)  # the second level's folder exists: refused up front
    result = CliRunner().invoke(app, ["run", "--engine", "vllm", "--engine-python", sys.executable,
                                      "--concurrency", "1,4", "--out", str(tmp_path / "sweep")])
    assert result.exit_code == 2 and "c4 exists" in result.output
    assert not (tmp_path / "sweep" / "c1").exists()


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


def test_bad_input_is_answered_before_torch_is_imported():
    """A typo costs no torch import (seconds on a loaded machine): `run` checks what it can first."""
    code = ("import sys; from typer.testing import CliRunner; from specbench_cli.cli import app; "
            "r = CliRunner().invoke(app, ['run', '--method', 'sufix']); "
            "assert r.exit_code == 2, r.output; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


def test_every_method_declares_a_range_for_each_numeric_option():
    """check_ranges looks each number up in the Options' RANGES: a method that forgot one fails here."""
    from specbench_cli.registry import METHODS, method_class
    from specbench_cli.options import parse_options

    for name in METHODS:
        parse_options(method_class(name), [])  # the defaults pass their own ranges


def test_routed_options_nest_each_proposers_and_the_flat_spelling_still_works_with_a_note():
    from specbench_methods.dflash import DFlash
    from specbench_methods.eagle3 import Eagle3
    from specbench_methods.whiflash import WhiFlashEntropy
    from specbench_cli.options import options_record, parse_options

    notes: list[str] = []
    dotted = parse_options(WhiFlashEntropy, ["eagle3.depth=4", "dflash.block_size=8", "threshold=1.2"], notes)
    assert dotted.eagle3 == Eagle3.Options(depth=4) and dotted.dflash == DFlash.Options(block_size=8)
    assert dotted.threshold == 1.2 and not notes
    flat = parse_options(WhiFlashEntropy, ["depth=4", "block_size=8", "threshold=1.2"], notes)
    assert flat == dotted and len(notes) == 2 and "write --opt eagle3.depth=" in notes[0]
    record = options_record(dotted)
    assert record["eagle3.depth"] == 4 and record["dflash.block_size"] == 8 and record["eagle3.top_k"] == 10
    # HVD's own EAGLE-3 setting (32/8/4) is its default, not EAGLE-3's (60/8/10)
    from specbench_methods.hvd import Hvd

    assert parse_options(Hvd, []).eagle3 == Eagle3.Options(depth=8, top_k=4, total_token=32)


def test_a_deprecated_train_drafter_flag_still_works_with_a_note():
    result = CliRunner().invoke(app, ["train-drafter", "--method", "eagle3", "--ttt", "2"])  # the folder exists
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[0] == "note: --ttt is deprecated and will be removed in the next release; write --opt eagle3.ttt=2"
    assert result.exit_code == 2 and "exists; pass --resume" in lines[1], result.output


def test_train_drafter_recipe_settings_take_the_dotted_dialect():
    from specbench_cli.commands.train.inputs import TrainSettings, train_settings

    base = TrainSettings(method="dart", steps=50)
    dotted = train_settings(base, ["dart.slots=6", "dart.gamma=0.5", "dart.draft-vocab=2048"])
    assert (dotted.slots, dotted.gamma, dotted.draft_vocab, dotted.steps) == (6, 0.5, 2048, 50)
    assert train_settings(base, []) == base


def test_the_torch_free_bucket_default_is_the_engines():
    from specbench_cli.core.target import DEFAULT_BUCKETS
    from specbench_cli.inputs import DEFAULT_BUCKETS as TEXT

    assert TEXT == ",".join(map(str, DEFAULT_BUCKETS))


def test_python_dash_m_is_the_same_command_line():
    result = subprocess.run([sys.executable, "-m", "specbench_cli", "run", "--method", "sufix"], capture_output=True,
                            text=True, cwd=Path(__file__).parent.parent)
    assert result.returncode == 2 and "did you mean 'suffix'" in result.stderr


def test_default_drafter_folder_falls_back_to_the_cache_when_the_project_is_read_only(monkeypatch, tmp_path):
    import specbench_cli.models as models

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    assert models.drafter_folder("m", "eagle3") == models.PROJECT_DRAFTERS / "m" / "eagle3"
    monkeypatch.setattr(models.os, "access", lambda path, mode: False)
    assert models.drafter_folder("m", "eagle3") == tmp_path / "cache" / "drafters" / "m" / "eagle3"


def test_a_default_init_inside_the_project_is_recorded_relative(tmp_path, monkeypatch):
    from specbench_cli.commands.train.inputs import relative_to_cwd as _relative_to_cwd
    (tmp_path / "drafters" / "eagle3").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert _relative_to_cwd(str(tmp_path / "drafters" / "eagle3")) == "drafters/eagle3"
    assert _relative_to_cwd("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B") == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert _relative_to_cwd("") == ""
