"""The user's path on the registered models: their hub ids and released drafters, read offline from a hub cache
of the released formats (tests/hub.py), through the commands a user types — calibrate then run, every method,
report — with nothing but tiny budgets added. Each run is lossless (its greedy replay finds no token off) and
records the repo id and resolved commit of every checkpoint it read."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench_cli.cli import app
from specbench_cli.models import DEFAULT_MODEL, MODELS, REVISIONS
from tests.conftest import THREADS

BUDGET = ["--limit", "2", "--max-new-tokens", "12", "--threads", THREADS]
CALIBRATE = ["--prompts", "2", "--max-new-tokens", "12", "--steps", "10", "--threads", THREADS]
HUB_MODELS = [name for name in MODELS if name != DEFAULT_MODEL]  # every registered model a user takes from the hub
# The routers calibrate makes, and the registered drafters each needs.
CALIBRATIONS = {"whiflash-entropy": ("eagle3", "dflash"), "whiflash-neural": ("eagle3", "dflash"), "hvd": ("eagle3",)}
UNAVAILABLE = {("llama3.1-8b", "dart"): "DART publishes drafters and tries for Qwen3 only",
               ("qwen3-8b", "confu"): "ConFu has no public weights"}


def calibrations(model: str) -> list[str]:
    return [name for name, needs in CALIBRATIONS.items() if set(needs) <= set(MODELS[model].drafters)]


def runnable(model: str) -> list[str]:
    """The methods whose every drafter is registered for the model, or made by a calibration it can take."""
    from specbench_cli.registry import METHODS as ALL, method_class

    made = {*MODELS[model].drafters, *calibrations(model)}
    return [name for name in ALL if set(method_class(name).drafter_names) <= made
            and (name != "whiflash-entropy" or name in made)]  # its thresholds, unless --opt threshold


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The hub cache, and the project's drafters folder moved to a temporary one (calibrate writes there)."""
    from tests.hub import offline_hub

    with offline_hub(tmp_path_factory, speculators_python()) as built:
        yield built


def speculators_python() -> str | None:
    """The engine's Python, where speculators writes RedHatAI's layout (qwen3-8b-think's drafter); None without it."""
    import os

    from specbench_cli.core.errors import UsageError
    from specbench_cli.engines.options import engine_python

    try:
        return engine_python(None, dict(os.environ))
    except UsageError:
        return None


def cli(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result.output


def one_line_error(*args: str) -> str:
    """A refused command: exit 2, no traceback, and one line saying why (after any line of what it planned)."""
    lines = cli(*args, code=2).strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in "".join(lines), lines
    return errors[0]


def commit_of(hub, repo: str) -> str:
    return hub.snapshots[repo].name


@pytest.fixture(scope="module")
def decoded(hub, tmp_path_factory):
    """Every runnable method on every registered hub model, after the calibrations run asks for, as one list of
    methods a model."""
    out = {}
    for model in HUB_MODELS:
        if any(ref.partition("@")[0] not in hub.snapshots for ref in MODELS[model].drafters.values()):
            continue  # RedHatAI's drafter, without speculators to write it (CI has it)
        for method in calibrations(model):
            cli("calibrate", "--method", method, "--model", model, *CALIBRATE, "--confirm", "0",
                "--work", str(tmp_path_factory.mktemp(f"cal-{model}-{method}")))
        out[model] = tmp_path_factory.mktemp(f"run-{model}")
        cli("run", "--method", ",".join(runnable(model)), "--model", model, *BUDGET, "--out", str(out[model]))
    return out


@pytest.mark.slow
def test_the_headline_command_runs_after_the_calibrate_it_asks_for(hub, tmp_path, monkeypatch):
    """`run --method whiflash-neural --model qwen3-8b` names a calibrate command; after it, the same run runs."""
    from specbench_cli import models

    monkeypatch.setattr(models, "PROJECT_DRAFTERS", tmp_path / "drafters")  # calibrations of its own
    for method in ("whiflash-neural", "hvd"):
        line = one_line_error("run", "--method", method, "--model", "qwen3-4b", *BUDGET, "--out", str(tmp_path / method))
        assert f"specbench calibrate --method {method} --model qwen3-4b" in line
        cli("calibrate", "--method", method, "--model", "qwen3-4b", *CALIBRATE, "--work", str(tmp_path / f"w-{method}"))
        cli("run", "--method", method, "--model", "qwen3-4b", *BUDGET, "--out", str(tmp_path / method))
        assert (tmp_path / method / "run.json").is_file()


def test_the_two_headline_models_run_every_method_they_have_drafters_for():
    assert set(runnable("qwen3-8b")) == {"baseline", "hf-generate", "suffix", "pld", "eagle3", "dflash", "dart", "sps",
                                         "flashhead", "whiflash-entropy", "whiflash-neural", "hvd", "hvd-freq"}
    assert set(runnable("llama3.1-8b")) == set(runnable("qwen3-8b")) - {"dart"}


@pytest.mark.slow
@pytest.mark.parametrize("model", HUB_MODELS)
def test_every_method_runs_lossless_and_records_its_checkpoints(decoded, hub, model):
    """Every registered model x method pair that has its drafters runs with nothing but a budget: lossless, its
    target and hub drafters recorded with their commits; every other pair is refused in one line."""
    from specbench_cli.registry import METHODS as ALL

    if model not in decoded:
        pytest.skip(f"{model}'s drafters need speculators to write them (scripts/setup-vllm.sh)")
    spec = MODELS[model]
    for method in runnable(model):
        folder = decoded[model] / method
        info = json.loads((folder / "run.json").read_text())
        prompts = pd.read_parquet(folder / "prompts.parquet")
        assert len(prompts) >= 2 and (prompts.replay_checked > 0).all(), method
        assert (prompts.replay_off == prompts.replay_ties).all(), method  # no mismatch: at most numeric ties
        if method != "hf-generate":  # transformers' own generate() is the one outside our exact target
            assert (prompts.replay_off == 0).all(), method
        repo = spec.target.partition("@")[0]
        assert info["target_weights"] == f"{repo}@{REVISIONS[repo]}" == f"{repo}@{commit_of(hub, repo)}"
        for name, weights in info["drafter_weights"].items():
            ref = spec.drafters.get(name)
            if ref is not None and "/" in ref and not Path(ref).exists():  # a hub drafter: its id and commit
                drafter = ref.partition("@")[0]
                assert weights == f"{drafter}@{commit_of(hub, drafter)}", (method, name)
    for method in sorted(set(ALL) - set(runnable(model))):
        one_line_error("run", "--method", method, "--model", model, *BUDGET, "--out", str(decoded[model] / "refused"))


@pytest.mark.parametrize(("model", "method"), UNAVAILABLE)
def test_a_method_without_a_drafter_is_one_line(hub, tmp_path, model, method):
    assert UNAVAILABLE[model, method] in one_line_error("run", "--method", method, "--model", model, *BUDGET,
                                                       "--out", str(tmp_path / "out"))


@pytest.mark.slow
def test_the_report_of_the_registered_runs(decoded, tmp_path):
    cli("report", str(decoded["qwen3-8b"]), "--out", str(tmp_path))
    rows = pd.read_csv(tmp_path / "overview.csv")
    assert set(runnable("qwen3-8b")) <= {label.partition("[")[0] for label in rows.method}  # eagle3[depth=...]


@pytest.mark.slow
def test_two_target_revisions_never_merge(hub, tmp_path):
    """The hub's main of Qwen/Qwen3-8B moves to another commit (other weights): a run before and one after are two
    report rows, and the first cannot be resumed on the new weights."""
    from tests.hub import lay

    repo, pinned = "Qwen/Qwen3-8B", REVISIONS["Qwen/Qwen3-8B"]
    moved = tmp_path / "moved"
    shutil.copytree(hub.snapshots[repo], moved)
    config = json.loads((moved / "config.json").read_text())
    (moved / "config.json").unlink()
    (moved / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))  # another commit's file
    main = hub.cache / f"models--{repo.replace('/', '--')}" / "refs" / "main"
    runs = tmp_path / "runs"
    try:
        cli("run", "--method", "baseline", "--model", "qwen3-8b", "--target", repo, *BUDGET, "--out", str(runs / "before"))
        lay(hub.cache, repo, moved, commit="1" * 40)  # main now names the new commit
        cli("run", "--method", "baseline", "--model", "qwen3-8b", "--target", repo, *BUDGET, "--out", str(runs / "after"))
        line = one_line_error("run", "--method", "baseline", "--model", "qwen3-8b", "--target", repo, *BUDGET,
                              "--out", str(runs / "before"), "--resume")
    finally:
        main.write_text(pinned)
    assert f"was run on target {repo}@{pinned}" in line and f"loads {repo}@{'1' * 40}" in line
    cli("report", str(runs), "--out", str(tmp_path / "report"))
    rows = pd.read_csv(tmp_path / "report" / "overview.csv")
    assert (rows.method.str.startswith("baseline")).sum() == 2, rows.method.tolist()


@pytest.mark.parametrize(("args", "said"), [
    (["--target", "Qwen/Qwen3-14B"], "not in the local hub cache"),
    (["--target", "Qwen/Qwen3-8B@" + "0" * 40], "Qwen/Qwen3-8B@0000"),
    (["--drafter", "eagle3=AngelSlim/Qwen3-8B_eagle3@" + "0" * 40], "AngelSlim/Qwen3-8B_eagle3@0000"),
])
def test_a_checkpoint_the_cache_lacks_is_one_line(hub, tmp_path, args, said):
    assert said in one_line_error("run", "--method", "eagle3", "--model", "qwen3-8b", *args, *BUDGET,
                                  "--out", str(tmp_path / "out"))


def test_a_snapshot_missing_a_shard_is_one_line(hub, tmp_path):
    local = tmp_path / "qwen3-8b"
    shutil.copytree(hub.snapshots["Qwen/Qwen3-8B"], local)
    (local / "model-00003-of-00005.safetensors").unlink()
    line = one_line_error("run", "--method", "baseline", "--model", "qwen3-8b", "--target", str(local), *BUDGET,
                          "--out", str(tmp_path / "out"))
    assert "model-00003-of-00005.safetensors is missing" in line


def test_a_drafter_config_missing_a_key_is_one_line(hub, tmp_path):
    local = tmp_path / "dart"
    shutil.copytree(hub.snapshots["fvliang/qwen8b-dart"], local)
    config = json.loads((local / "config.json").read_text())
    (local / "config.json").unlink()
    (local / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "draft_length"}))
    line = one_line_error("run", "--method", "dart", "--model", "qwen3-8b", "--drafter", f"dart={local}", *BUDGET,
                          "--out", str(tmp_path / "out"))
    assert "draft_length" in line and "config.json" in line


@pytest.mark.parametrize("method", ["whiflash-neural", "hvd"])
def test_calibrate_refuses_prompts_it_cannot_use(hub, method):
    assert "--prompts must be at least 2" in one_line_error("calibrate", "--method", method, "--model", "qwen3-8b",
                                                            "--prompts", "1")


@pytest.mark.slow
def test_oracle_tune_and_profile_on_a_registered_model(hub, tmp_path):
    """oracle and tune record the weights they measured; run --tuned refuses other weights; profile --phases run
    twice into one folder says --resume, and --resume continues it."""
    oracle = tmp_path / "oracle"
    cli("oracle", "--drafters", "eagle3,dflash,suffix", "--model", "qwen3-8b", *BUDGET, "--out", str(oracle))
    info = json.loads((oracle / "run.json").read_text())
    assert info["target_weights"] == f"Qwen/Qwen3-8B@{REVISIONS['Qwen/Qwen3-8B']}"
    assert set(info["drafter_weights"]) == {"eagle3", "dflash"}
    cli("tune", "--method", "eagle3", "--model", "qwen3-8b", *BUDGET, "--out", str(tmp_path / "tune"))
    tuned = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert set(tuned["weights"]) == {"target", "eagle3"}
    cli("run", "--method", "eagle3", "--model", "qwen3-8b", "--tuned", *BUDGET, "--out", str(tmp_path / "tuned"))
    moved = tmp_path / "eagle3-retrained"
    shutil.copytree(hub.snapshots["AngelSlim/Qwen3-8B_eagle3"], moved)
    assert "re-run `specbench tune" in one_line_error("run", "--method", "eagle3", "--model", "qwen3-8b", "--tuned",
                                                      "--drafter", f"eagle3={moved}", *BUDGET,
                                                      "--out", str(tmp_path / "tuned-other"))
    profile = ["profile", "--phases", "--method", "eagle3", "--model", "qwen3-8b", *BUDGET, "--out", str(tmp_path / "p")]
    cli(*profile)
    assert "pass --resume" in one_line_error(*profile)
    cli(*profile, "--resume")


@pytest.mark.slow
def test_a_sweep_over_the_registered_models_and_the_gate(hub, tmp_path):
    """sweep's grid over qwen3-8b and llama3.1-8b, then the nightly gate (`report --compare`) of two runs."""
    config = tmp_path / "grid.toml"
    config.write_text(f'out = "{tmp_path / "sweep"}"\nmodels = ["qwen3-8b", "llama3.1-8b"]\n'
                      'datasets = ["spec-bench"]\nmethods = ["baseline", "eagle3"]\n'
                      f'[run]\nlimit = 2\nmax_new_tokens = 12\nthreads = {THREADS}\n')
    cli("sweep", str(config))
    assert len(list((tmp_path / "sweep").glob("*/run.json"))) == 4
    for night in ("reference", "nightly"):
        cli("run", "--method", "baseline,eagle3", "--model", "qwen3-8b", *BUDGET, "--repeat", "2",
            "--out", str(tmp_path / night))
    result = CliRunner().invoke(app, ["report", str(tmp_path / "nightly"), "--compare", str(tmp_path / "reference"),
                                      "--max-regression", "50", "--out", str(tmp_path / "gate")])
    assert result.exit_code in (0, 3), result.output  # pass, or too few passes to decide; never a changed output


def test_vllm_is_sized_for_the_run(hub, tmp_path):
    """vLLM's max_model_len is the run's longest prompt plus its tokens and a round's drafts, not the model's whole
    context; the engines of a list share one GPU's memory; what --engine-arg sets wins."""
    import dataclasses

    import torch

    from specbench_cli.commands.interleave import share_the_device
    from specbench_cli.engines import vllm
    from specbench_cli.inputs import EnginePlan, RunConfig
    from specbench_cli.planning import plan
    from specbench_cli.registry import ENGINES

    planned = plan(RunConfig(method="baseline", model="llama3.1-8b", limit=2, max_new_tokens=12,
                             out=tmp_path / "out"), {})
    on_gpu = dataclasses.replace(planned, device=torch.device("cuda"), engine=EnginePlan())
    both = share_the_device([on_gpu, on_gpu], [ENGINES["vllm"], ENGINES["vllm"]])
    config = vllm.target_config(planned)
    args = vllm.sized(both[0], 300, config)
    assert args == {"max_model_len": 300 + vllm.DRAFT_ROOM, "gpu_memory_utilization": 0.45}
    assert vllm.sized(dataclasses.replace(on_gpu, engine=EnginePlan(args={"max_model_len": 4096})), 300, config) == \
        {"gpu_memory_utilization": 0.9}
    assert vllm.cpu_kv_gib(planned, 300, config) == 1


# ---------------------------------------------------------------------------------------------- every shown command
NIGHTLY = Path(__file__).resolve().parent.parent / "benchmarks" / "nightly" / "github-workflow.yml"
# What a shown command may ask that tiny weights cannot give in a test's time, and why it is left to another test.
NOT_HERE = {"--target random:": "builds a registered architecture at its full size (tests/test_random_weights.py)",
            "--engine vllm": "an engine start each: tests/test_engine_vllm_hub.py runs the README's vLLM lines",
            "$": "a shell loop's variable", "--slurm": "writes a Slurm script only (tests/test_sweep.py)",
            "train-drafter": "a self-distillation corpus and training (tests/test_train_drafter.py)",
            "benchmarks/parity/": "hub datasets, not vendored (tests/test_hub_datasets.py)"}
SHRINK = {"--limit": 2, "--max-new-tokens": 12, "--repeat": 2, "--prompts": 2, "--steps": 10}
LEVELS = {"--batch-size": "1,2", "--concurrency": "1,2"}
TAKES_MODEL = ("run", "oracle", "calibrate", "tune", "profile")


def shown_commands() -> list[tuple[str, str]]:
    """(where, command) for every `specbench ...` line of the README, docs/ and the nightly workflow, in order."""
    from tests.test_docs import PAGES, commands

    shown = [(page.name, args) for page in PAGES for args in commands(page)]
    workflow = re.sub(r"\\\n\s*", " ", NIGHTLY.read_text())  # continuation lines joined
    for line in workflow.replace('"$REFERENCE"', "results/reference").replace("$dataset", "spec-bench").splitlines():
        if ".venv/bin/specbench " in line:
            shown.append((NIGHTLY.name, line.split(".venv/bin/specbench ", 1)[1].split(" || ")[0].strip()))
    return shown


def on_the_registered_model(args: list[str], model: str = "qwen3-8b") -> list[str]:
    """A shown command on `model` (the embedded model replaced, or --model added) with tiny budgets."""
    out, i = [], 0
    while i < len(args):
        word = args[i]
        if word in SHRINK and i + 1 < len(args):
            out += [word, str(min(int(args[i + 1]), SHRINK[word]))]
            i += 2
        elif word in LEVELS and i + 1 < len(args):
            out += [word, LEVELS[word]]
            i += 2
        elif word == "--model":
            out += [word, model]
            i += 2
        else:
            out.append(word)
            i += 1
    if out[0] in TAKES_MODEL:
        out += [] if "--model" in out else ["--model", model]
        out += ["--threads", THREADS] + (["--max-new-tokens", "12"] if "--max-new-tokens" not in out else [])
        out += ["--limit", "2"] if out[0] in ("run", "oracle", "tune", "profile") and "--limit" not in out else []
        out += [*([] if "--prompts" in out else ["--prompts", "2"]), "--steps", "10", "--confirm", "1"] \
            if out[0] == "calibrate" else []
    return out


@pytest.mark.slow
def test_every_command_the_docs_show_runs_on_the_registered_models(hub, tmp_path, monkeypatch, capsys):
    """Each page's commands in the page's order, in a folder of the page's own (a report reads the runs the page
    ran before it), on qwen3-8b from the hub: exit 0 and no traceback; the gate 0, 1 or 3 (its verdicts). The table
    of commands, exit codes and seconds is printed (pytest -s)."""
    import shlex
    import time

    from specbench_cli import models

    monkeypatch.setattr(models, "PROJECT_DRAFTERS", tmp_path / "drafters")  # its calibrations of its own
    ran, skipped = [], []
    for where, command in shown_commands():
        reason = next((why for key, why in NOT_HERE.items() if key in command), None)
        if reason:
            skipped.append((where, command, reason))
            continue
        folder = tmp_path / where
        folder.mkdir(exist_ok=True)
        monkeypatch.chdir(folder)
        args = on_the_registered_model(shlex.split(command))
        unread = [a for a in args[1:] if args[0] == "report" and a.startswith("results/") and not Path(a).exists()
                  and "--compare" not in args]
        if unread:  # the runs of a command left to another test
            skipped.append((where, command, f"reads {unread[0]}, written by a command not run here"))
            continue
        if where == NIGHTLY.name and args[0] == "report":  # the workflow's report lines are the two branches of
            shutil.rmtree(folder / "results" / "nightly" / "report", ignore_errors=True)  # an if: one runs a night
        if "--compare" in args and not (folder / "results" / "reference").exists():  # an earlier night's runs
            shutil.copytree(folder / "results" / "nightly", folder / "results" / "reference")
        start = time.perf_counter()
        result = CliRunner().invoke(app, args)
        ran.append((where, shlex.join(args), result.exit_code, time.perf_counter() - start))
        allowed = (0, 1, 3) if "--compare" in args else (0,)
        assert result.exit_code in allowed and "Traceback" not in result.output, (where, args, result.output[-2000:])
    with capsys.disabled():
        print("\nshown commands on qwen3-8b from the hub (where | command | exit | s):")
        for where, args, code, seconds in ran:
            print(f"  {where} | specbench {args} | {code} | {seconds:.1f}")
        for where, command, reason in skipped:
            print(f"  {where} | specbench {command} | not here: {reason}")
    assert len(ran) >= 25


def test_the_llama_eagle3_without_rope_theta_takes_the_references_base(hub):
    """yuhuili's config names no rope_theta and no rope_scaling: the reference's rotary then uses base 10000 and no
    scaling (SafeAILab/EAGLE cnets.py), never the target's 500000 with llama3 scaling."""
    from specbench_methods.checkpoints import Checkpoint
    from specbench_methods.eagle3.checkpoint import read_config

    snapshot = hub.snapshots["yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"]
    assert (snapshot / "pytorch_model.bin").is_file() and not list(snapshot.glob("*.safetensors"))
    config = json.loads((snapshot / "config.json").read_text())
    assert "rope_theta" not in config and "rope_scaling" not in config
    c = read_config(Checkpoint.read(str(snapshot), "eagle3"), 8)
    assert (c.rope_theta, c.rope_scaling) == (10000.0, None) and c.draft_vocab < c.vocab
