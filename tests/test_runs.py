"""End-to-end runs on the embedded model: multi-turn losslessness, records, kill-and-resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from specbench_cli.cli import app
from specbench_cli.records import PromptRecord, RoundRecord, read_table, schema
from tests.conftest import THREADS, needs_embedded
from tests.helpers import tree_opts

pytestmark = needs_embedded
COMMON = ["--model", "smollm2-135m", "--threads", THREADS, "--dtype", "float32"]  # subprocesses too
TOKENS = "32"  # per turn in the multi-turn runs and the committed drafters' runs (they are compared): CI time
SMALL_TREE = tree_opts(8, 3, 3)  # EAGLE-3-style trees: CPU time in CI
ROUTED_TREE = tree_opts(8, 3, 3, "eagle3")  # the same tree as a routed method's EAGLE-3


def run_cli(*args: str) -> None:
    result = CliRunner().invoke(app, ["run", *COMMON, *args])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def drafters(embedded, tmp_path_factory):
    """Random drafters for the embedded model in each released format (they load through --drafter; they
    accept little, so they check the plumbing and losslessness), and the model itself as an SpS drafter."""
    from specbench_cli.loading import embedded_folder
    from tests.drafter_fixtures import write_confu, write_dart, write_dflash, write_eagle3

    root, target = tmp_path_factory.mktemp("drafters"), embedded.model
    return {"eagle3": ["--drafter", f"eagle3={write_eagle3(root / 'eagle3', target)}", *SMALL_TREE],
            "dflash": ["--drafter", f"dflash={write_dflash(root / 'dflash', target)}"],
            "dart": ["--drafter", f"dart={write_dart(root / 'dart', target)}", "--opt", "trie=none",
                     "--opt", "total=8", "--opt", "beam_width=3", "--opt", "top_k=3"],
            "confu": ["--drafter", f"confu={write_confu(root / 'confu', target)}", *SMALL_TREE],
            "sps": ["--drafter", f"sps={embedded_folder()}"],
            # the committed eagle3 and dflash drafters; a threshold inside the entropies seen, so it switches
            "whiflash-entropy": ["--opt", "threshold=2.0", *ROUTED_TREE, "--opt", "dflash.block_size=4"],
            # the committed eagle3 drafter and the suffix cache; a low score threshold, so both draft
            "hvd-freq": ["--opt", "threshold=1.0", *ROUTED_TREE],
            "hvd": ["--opt", "threshold=1.0", *ROUTED_TREE]}  # the committed payoff predictor


@pytest.fixture(scope="module")
def multi_turn(tmp_path_factory, drafters):
    """mt-bench (2 turns) and two repetitive spec-bench subtasks, decoded by every method."""
    root = tmp_path_factory.mktemp("results")
    runs = {}
    for method in ("baseline", "suffix", "pld", "hf-generate", *drafters):
        out = root / method
        # model-based drafters (random, so slow per token on CPU) decode the two-turn writing prompt only
        categories = ["writing"] if method in drafters else ["writing", "summarization"]
        run_cli("--method", method, "--dataset", "spec-bench", *(a for c in categories for a in ("--category", c)),
                "--limit", str(len(categories)), "--max-new-tokens", TOKENS, "--warmup", "0", "--out", str(out),
                *drafters.get(method, []))
        runs[method] = out
    return runs


@pytest.mark.slow
def test_every_method_matches_baseline_turn_by_turn(multi_turn):
    base = read_table(multi_turn["baseline"], "prompts").sort_values(["prompt_id", "turn"])
    assert base.turn.max() == 1  # the writing prompt has two turns
    for method, out in multi_turn.items():
        mine = read_table(out, "prompts").sort_values(["prompt_id", "turn"])
        same = base.merge(mine, on=["prompt_id", "turn"], suffixes=("", "_method"))
        assert len(same) == len(mine) >= 2, method
        assert list(same.output_hash_method) == list(same.output_hash), method
        assert [list(x) for x in same.output_ids_method] == [list(x) for x in same.output_ids], method


@pytest.mark.slow
def test_sps_with_the_model_itself_accepts_every_draft(multi_turn):
    rounds = read_table(multi_turn["sps"], "rounds")
    inner = rounds[rounds["round"] < rounds.groupby(["prompt_id", "turn"])["round"].transform("max")]  # not cut by the budget
    assert (inner.emitted == inner.tree_size + 1).mean() >= 0.8 and (rounds.tree_size == 6).all()


@pytest.mark.slow
def test_suffix_accepts_drafts_on_the_real_model(multi_turn):
    rounds = read_table(multi_turn["suffix"], "rounds")
    assert rounds.accepted.sum() > 0 and rounds.accepted.max() >= 2
    prompts = read_table(multi_turn["suffix"], "prompts")
    assert (prompts.tau >= 1).all() and prompts.tau.max() > 1


@pytest.mark.slow
def test_records_follow_the_schema(multi_turn):
    out = multi_turn["suffix"]
    for name, cls in (("rounds", RoundRecord), ("prompts", PromptRecord)):
        for part in (out / f"{name}.parquet").glob("part-*.parquet"):
            assert pq.read_schema(part).remove_metadata() == schema(cls)
    prompts, rounds = read_table(out, "prompts"), read_table(out, "rounds")
    assert len(rounds) == prompts.rounds.sum()
    assert (prompts.decode_tokens == prompts.new_tokens - 1).all()
    per_turn = rounds.groupby(["prompt_id", "turn"]).emitted.sum()
    assert list(per_turn.values) == list(prompts.sort_values(["prompt_id", "turn"]).decode_tokens)
    assert (rounds.wall_ms >= rounds.verify_ms).all()
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete" and info["clock"] == "perf_counter_ns"
    assert info["settings"]["options"]["max_depth"] == 64
    summary = pd.read_csv(out / "summary.csv")
    assert summary.speedup.notna().all()  # the baseline beside it was found
    assert (out / "summary.md").exists()


@pytest.mark.slow
def test_kill_and_resume_gives_the_uninterrupted_records(tmp_path):
    args = ["--method", "suffix", "--dataset", "spec-bench", "--limit", "3", "--max-new-tokens", "24", "--warmup", "1"]
    whole = tmp_path / "whole"
    run_cli(*args, "--out", str(whole))

    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "specbench_cli.cli", "run", *COMMON, *args, "--out", str(killed)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.time() + 600  # generous: on a loaded small machine loading and the warm-up took minutes
    while not list((killed / "prompts.parquet").glob("part-*.parquet")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the run to be killed ended by itself (exit {proc.returncode}) before it was killed"
    second = CliRunner().invoke(app, ["run", *COMMON, *args, "--out", str(killed), "--resume"])  # while it runs
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert second.exit_code == 2 and f"in use by pid {proc.pid}" in second.output, second.output
    kept = read_table(killed, "prompts")
    assert 1 <= kept["index"].nunique() < 3, "the kill should land after the first prompt and before the last"

    result = CliRunner().invoke(app, ["run", *COMMON, *args, "--out", str(killed), "--resume"])
    assert result.exit_code == 0 and f"stale lock of pid {proc.pid}" in result.output, result.output
    sessions = json.loads((killed / "run.json").read_text())["sessions"]
    assert len(sessions) == 2 and sessions[1]["prompts"] == 3 - kept["index"].nunique()  # each session's provenance
    for name, cols in (("prompts", ["prompt_id", "turn", "output_hash", "rounds", "decode_tokens"]),
                       ("rounds", ["prompt_id", "turn", "round", "tree_size", "accepted", "emitted", "kv_len"])):
        a = read_table(whole, name)[cols].sort_values(cols[:3]).reset_index(drop=True)
        b = read_table(killed, name)[cols].sort_values(cols[:3]).reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b)


def _first_prompt_then(signum: int, out, args: list[str]) -> subprocess.CompletedProcess:
    """Start a run in a subprocess, send it `signum` once its first prompt is written, and wait for it to end."""
    cmd = [sys.executable, "-m", "specbench_cli.cli", "run", *COMMON, *args, "--out", str(out)]
    # a shell's background job (`pytest ... &`) ignores SIGINT, and a child inherits that: restore the default
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 600
    while not list((out / "prompts.parquet").glob("part-*.parquet")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended by itself (exit {proc.returncode}) before it was signalled"
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, proc.returncode, "", stderr)


@pytest.mark.slow
@pytest.mark.parametrize("signum, code, reason", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_sigterm_and_ctrl_c_keep_finished_prompts_release_the_lock_and_say_interrupted(tmp_path, signum, code, reason):
    """What Slurm sends at a time limit (SIGTERM) ends a run as Ctrl-C does: one line, the lock released (so a
    job requeued on another host may resume), run.json "interrupted", and --resume finishes it."""
    # 64 tokens a turn: the two prompts left take seconds, so the signal lands inside them even on a busy machine
    # (with 24, a clean-clone CI run beside other work once finished them first and exited 0)
    args = ["--method", "suffix", "--dataset", "spec-bench", "--limit", "3", "--max-new-tokens", "64", "--warmup", "0"]
    out = tmp_path / "r"
    ended = _first_prompt_then(signum, out, args)
    assert ended.returncode == code, ended.stderr
    assert ended.stderr.strip().splitlines()[-1].startswith("interrupted"), ended.stderr
    assert not (out / ".lock").exists()
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "interrupted" and info["reason"] == reason and info["sessions"][-1]["ended"] == "interrupted"
    kept = read_table(out, "prompts")["index"].nunique()
    assert 1 <= kept < 3
    run_cli(*args, "--out", str(out), "--resume")
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete" and "reason" not in info and read_table(out, "prompts")["index"].nunique() == 3


@pytest.mark.slow
def test_a_failed_write_is_one_line_and_the_run_resumes_once_space_is_back(tmp_path, monkeypatch):
    """Disk full (or a permission, or a vanished folder) while writing a part: one line naming the path and the
    cause, run.json "failed" with it, the finished prompt kept, and --resume continues."""
    import errno

    from specbench_cli import run_folder

    real = run_folder.write_atomically

    def full_disk(path, write):
        if path.name == "part-00001.parquet":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, write)

    args = ["--method", "baseline", "--dataset", "aime25", "--limit", "2", "--max-new-tokens", "4", "--warmup", "0"]
    out = tmp_path / "r"
    monkeypatch.setattr(run_folder, "write_atomically", full_disk)
    result = CliRunner().invoke(app, ["run", *COMMON, *args, "--out", str(out)])
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    part = out / "rounds.parquet" / "part-00001.parquet"
    assert lines[0] == f"error: cannot write {part}: No space left on device", result.output
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and info["reason"] == lines[0].removeprefix("error: ")
    assert list(read_table(out, "prompts")["index"]) == [0] and not (out / ".lock").exists()
    monkeypatch.setattr(run_folder, "write_atomically", real)
    run_cli(*args, "--out", str(out), "--resume")
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert sorted(read_table(out, "prompts")["index"]) == [0, 1]


def test_resume_refuses_changed_settings(tmp_path):
    out = tmp_path / "r"
    run_cli("--method", "baseline", "--dataset", "aime25", "--limit", "1", "--max-new-tokens", "4", "--warmup", "0", "--out", str(out))
    result = CliRunner().invoke(app, ["run", *COMMON, "--method", "baseline", "--dataset", "aime25", "--limit", "1",
                                      "--max-new-tokens", "8", "--warmup", "0", "--out", str(out), "--resume"])
    assert result.exit_code == 2 and "max_new_tokens" in result.output
    other = "2" if THREADS == "1" else "1"  # refused before anything decodes
    result = CliRunner().invoke(app, ["run", "--model", "smollm2-135m", "--threads", other, "--method", "baseline",
                                      "--dataset", "aime25", "--limit", "1", "--max-new-tokens", "4", "--warmup", "0",
                                      "--out", str(out), "--resume"])
    assert result.exit_code == 2, result.output
    assert f"measured differently (torch_threads {THREADS} -> {other})" in result.output, result.output


def test_resume_refuses_drafter_weights_changed_under_the_same_path(drafters, tmp_path):
    """A drafter retrained in place (same --drafter folder, or the registered one) would mix two drafters' records
    in one run: run.json records each drafter's fingerprint, and --resume checks it."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "eagle3"
    shutil.copytree(drafters["eagle3"][1].partition("=")[2], folder)
    args = ["--method", "eagle3", "--drafter", f"eagle3={folder}", *SMALL_TREE, "--dataset", "aime25",
            "--limit", "1", "--max-new-tokens", "4", "--warmup", "0", "--out", str(tmp_path / "r")]
    run_cli(*args)
    assert set(json.loads((tmp_path / "r" / "run.json").read_text())["drafter_weights"]) == {"eagle3"}
    weights = load_file(folder / "model.safetensors")
    save_file({k: v + 1 if k == min(weights) else v for k, v in weights.items()}, folder / "model.safetensors")
    result = CliRunner().invoke(app, ["run", *COMMON, *args, "--resume"])
    assert result.exit_code == 2 and "eagle3 drafter weights differ" in result.output, result.output


def test_recorded_weights_cover_the_trie_and_calibrated_thresholds(tmp_path):
    """DART's n-gram trie and a router's thresholds (config.json) shape a run as much as tensors do: a changed
    trie or a recalibrated entropy router changes what run.json records, while the drafters' own fingerprints
    stay those the committed calibration cards were made with."""
    import shutil

    from specbench_cli.models import project_drafters
    from specbench_cli.inputs import RunConfig
    from specbench_cli.planning import drafter_weights, plan

    registered = project_drafters("smollm2-135m")
    copies = {name: shutil.copytree(registered[name], tmp_path / name) for name in ("dart", "whiflash-entropy")}

    def weights(method: str, *drafters: str, opts: tuple[str, ...] = ()) -> dict[str, str]:
        config = RunConfig(method=method, limit=1, out=tmp_path / "out", drafters=list(drafters), opts=list(opts))
        return drafter_weights(plan(config, {}))

    entropy = weights("whiflash-entropy")
    assert set(weights("whiflash-entropy", opts=("threshold=2.0",))) == {"eagle3", "dflash"}  # the card is not read
    card = json.loads((tmp_path / "whiflash-entropy" / "config.json").read_text())
    assert {n: entropy[n] for n in ("eagle3", "dflash")} == card["drafters"]  # unchanged for tensors alone
    router = f"whiflash-entropy={copies['whiflash-entropy']}"
    assert weights("whiflash-entropy", router)["whiflash-entropy"] == entropy["whiflash-entropy"]
    config = json.loads((copies["whiflash-entropy"] / "config.json").read_text())
    (copies["whiflash-entropy"] / "config.json").write_text(json.dumps({**config, "threshold": config["threshold"] + 1}))
    assert weights("whiflash-entropy", router)["whiflash-entropy"] != entropy["whiflash-entropy"]

    dart = weights("dart", f"dart={copies['dart']}", f"dart_ngram={copies['dart']}")
    assert dart == weights("dart")  # the registered run records both: the trie is found beside the draft
    trie = copies["dart"] / "small.trie"
    trie.write_bytes(trie.read_bytes()[:-1] + bytes([trie.read_bytes()[-1] ^ 1]))
    changed = weights("dart", f"dart={copies['dart']}", f"dart_ngram={copies['dart']}")
    assert changed["dart"] != dart["dart"] and changed["dart_ngram"] != dart["dart_ngram"]


def test_a_hub_drafter_is_recorded_with_the_commit_its_cache_resolves_to(tmp_path, monkeypatch):
    """A hub repo's main branch moves, so run.json records a hub drafter as "id@commit"; an id the cache cannot
    resolve offline is one line before the target loads. The cache here is laid out as huggingface_hub writes it."""
    from huggingface_hub import constants

    from specbench_cli.core.errors import UsageError
    from specbench_cli.inputs import RunConfig
    from specbench_cli.planning import drafter_weights, plan

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--eagle3-drafter"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def weights(ref: str) -> dict[str, str]:
        config = RunConfig(method="eagle3", limit=1, out=tmp_path / "out", drafters=[f"eagle3={ref}"])
        return drafter_weights(plan(config, {}))

    assert weights("someone/eagle3-drafter") == {"eagle3": f"someone/eagle3-drafter@{commit}"}
    with pytest.raises(UsageError, match="cannot fetch drafter checkpoint 'someone/missing'"):
        weights("someone/missing")


def test_warm_up_never_uses_a_scored_prompt_and_long_prompts_are_refused(tmp_path):
    data = tmp_path / "one.jsonl"
    data.write_text('{"id": "only", "turns": ["Name a colour."]}\n')
    result = CliRunner().invoke(app, ["run", *COMMON, "--dataset", str(data), "--max-new-tokens", "4",
                                      "--out", str(tmp_path / "w")])
    assert result.exit_code == 0 and "a built-in prompt warms up" in result.output, result.output
    assert json.loads((tmp_path / "w" / "run.json").read_text())["settings"]["warmup"] == ["builtin-warmup"]
    assert "specbench report" in result.output  # the summary says how to get a speedup

    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"id": "huge", "turns": ["word " * 9000]}) + "\n")
    result = CliRunner().invoke(app, ["run", *COMMON, "--dataset", str(long), "--max-new-tokens", "4", "--warmup", "0",
                                      "--out", str(tmp_path / "l")])
    assert result.exit_code == 2 and "prompt 'huge' needs up to" in result.output and "context is 8192" in result.output
    assert not (tmp_path / "l").exists()  # nothing decoded, nothing left to be told "exists" about


def test_a_target_keeps_one_copy_of_each_weight_where_nothing_reads_the_plain_ones(tmp_path):
    """`planning.one_weight_copy`: the plain weights go (and run.json says `weight_copies` 1) only where every run
    on the loaded target reads it through packed targets."""
    from specbench_cli.core.kernels import can_pack
    from specbench_cli.inputs import RunConfig
    from specbench_cli.planning import one_weight_copy, plan

    def planned(method: str, **settings):
        return plan(RunConfig(method=method, limit=1, out=tmp_path / method, **settings), {})

    unreplayed = planned("baseline", replay=False)  # float32 (conftest): packed with the float32 kernels
    if not unreplayed.prepacked:
        pytest.skip("this torch build does not pack float32")
    assert one_weight_copy([unreplayed, planned("suffix", replay=False)])
    assert not one_weight_copy([planned("baseline")])  # its replay's float32 target reads the plain weights
    assert not one_weight_copy([unreplayed, planned("hf-generate", replay=False)])  # generate() reads them too
    assert not one_weight_copy([unreplayed, planned("sps", replay=False)])  # its draft model may copy the head
    half = planned("baseline", dtype="bfloat16")  # its replay's target packs as the run's does
    assert one_weight_copy([half]) == can_pack(torch.device("cpu"), torch.bfloat16)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["eagle3", "dflash", "dart", "confu", "sps", "flashhead"])
def test_committed_drafters_are_lossless_and_beat_a_random_one(multi_turn, tmp_path, method):
    """The project's trained drafters (drafters/smollm2-135m/*, found without --drafter) on a two-turn prompt.
    sps and flashhead are compared with nothing random (the fixture's sps drafter is the model itself)."""
    out = tmp_path / "trained"
    run_cli("--method", method, "--dataset", "spec-bench", "--category", "writing", "--limit", "1",
            "--max-new-tokens", TOKENS, "--warmup", "0", "--out", str(out), *(SMALL_TREE if method in ("eagle3", "confu") else []))
    base = read_table(multi_turn["baseline"], "prompts")
    mine = read_table(out, "prompts")
    same = base.merge(mine, on=["prompt_id", "turn"], suffixes=("", "_trained"))
    assert len(same) == 2 and list(same.output_hash_trained) == list(same.output_hash)
    trained = read_table(out, "rounds")
    assert trained.accepted.sum() > 0
    if method in multi_turn and method != "sps":
        assert trained.accepted.sum() > 2 * read_table(multi_turn[method], "rounds").accepted.sum()


@pytest.mark.slow
def test_report_over_real_runs_is_lossless_and_complete(multi_turn, tmp_path, drawn):
    """`report` over the multi-turn runs: every method identical to baseline, speedups against that baseline."""
    root = next(iter(multi_turn.values())).parent
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["report", str(root), "--out", str(out)])
    assert result.exit_code == 0, result.output
    lossless = pd.read_csv(out / "lossless.csv")
    methods = {label.split("[")[0] for label in lossless.method}  # eagle3 ran with a small tree: "eagle3[depth=3,…]"
    assert methods >= {"suffix", "pld", "eagle3", "dflash", "dart", "confu", "sps", "whiflash-entropy"}
    assert (lossless.identical == 1.0).all()
    overview = pd.read_csv(out / "overview.csv").set_index("method")
    assert overview.loc["suffix", "speedup"] > 0 and overview.loc["suffix", "baseline"].endswith("/baseline")
    assert (out / "survival.png").exists() and (out / "per_subtask_spec-bench.pdf").exists()
    drafting = {"suffix", "pld", "eagle3", "dflash", "dart", "confu", "sps", "whiflash-entropy", "hvd", "hvd-freq"}
    drawn_methods = {label.split("[")[0] for label in drawn["survival"]["legend"]}
    assert drawn_methods >= drafting and all(n > 0 for n in drawn["survival"]["points"])  # a curve per drafter
    assert {label.split("[")[0] for label in drawn["per_subtask_spec-bench"]["legend"]} >= drafting


@pytest.mark.slow
def test_profile_phases_and_head(tmp_path, drawn):
    phases = CliRunner().invoke(app, ["profile", "--phases", "--method", "suffix", *COMMON, "--limit", "1",
                                      "--max-new-tokens", "24", "--warmup", "0", "--out", str(tmp_path / "p")])
    assert phases.exit_code == 0, phases.output
    table = pd.read_parquet(tmp_path / "p" / "profile" / "phases.parquet").set_index("part")
    assert table.loc["verify", "mean_ms"] > 0 and table.loc["round", "share_pct"] == pytest.approx(100)
    assert (tmp_path / "p" / "profile" / "phases.pdf").exists()
    assert {"draft_body", "verify"} <= set(drawn["phases"]["legend"]) and "suffix" in drawn["phases"]["legend"]
    head = CliRunner().invoke(app, ["profile", "--component", "head", "--method", "flashhead", *COMMON, "--reps", "5",
                                    "--warmup-reps", "1", "--out", str(tmp_path / "h")])
    assert head.exit_code == 0, head.output
    frame = pd.read_parquet(tmp_path / "h" / "head.parquet")
    assert list(frame.variant) == ["dense", "FlashHead"] * 2 and (frame.mean_ms > 0).all()


@pytest.mark.slow
def test_whiflash_switches_on_the_real_model(multi_turn):
    rounds = read_table(multi_turn["whiflash-entropy"], "rounds")
    assert set(rounds.proposer) == {"eagle3", "dflash"} and rounds.entropy.notna().all()
    assert (rounds[rounds.proposer == "eagle3"].backlog > 1).any()  # a lazy catch-up after a DFlash stretch


@pytest.mark.slow
def test_hvd_routes_on_the_real_model(multi_turn):
    from specbench_methods.hvd import FEATURES

    for method in ("hvd", "hvd-freq"):  # hvd: the committed payoff predictor (drafters/smollm2-135m/hvd)
        rounds = read_table(multi_turn[method], "rounds")
        assert set(rounds.proposer) == {"suffix", "eagle3"}, f"{method} never switched: {set(rounds.proposer)}"
        assert rounds.router_score.notna().all()
        assert (rounds.features.str.split(",").map(len) == len(FEATURES)).all()


# oracle -> calibrate -> run, one step per test (each later step's fixture runs the earlier one), so a failure
# names the step that broke.
@pytest.fixture(scope="module")
def oracle_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("chain") / "o"
    oracle = CliRunner().invoke(app, ["oracle", "--drafters", "eagle3,suffix", *COMMON, "--limit", "1", "--max-new-tokens",
                                      "24", "--warmup", "0", "--out", str(out)])
    assert oracle.exit_code == 0, f"step 1, oracle: {oracle.output}"
    return out


@pytest.fixture(scope="module")
def neural_router(tmp_path_factory):
    root = tmp_path_factory.mktemp("chain_cal")
    result = CliRunner().invoke(app, ["calibrate", "--method", "whiflash-neural", *COMMON, "--prompts", "3",
                                      "--max-new-tokens", "16", "--steps", "20", "--out", str(root / "cal"),
                                      "--work", str(root / "work")])
    assert result.exit_code == 0, f"step 2, calibrate: {result.output}"
    return root / "cal"


@pytest.mark.slow
def test_chain_1_oracle_writes_replay_drafts_and_oracle_rows(oracle_dir):
    replay = pd.read_parquet(oracle_dir / "replay.parquet")
    assert set(replay.drafter) == {"eagle3", "suffix"} and (replay.accepted >= 0).all()
    drafts = pd.read_parquet(oracle_dir / "drafts.parquet")  # the suffix cache's draft at every position
    assert set(drafts.drafter) == {"suffix"} and len(drafts) == (replay.drafter == "suffix").sum()
    assert "Oracle-Token" in (oracle_dir / "oracle_o.md").read_text()
    assert json.loads((oracle_dir / "run.json").read_text())["status"] == "complete"


@pytest.mark.slow
def test_chain_2_calibrate_writes_a_router_card_and_its_sweep(neural_router):
    card = json.loads((neural_router / "config.json").read_text())
    assert card["train_pairs"] > 0 and card["latency"]["eagle3_round_ms"] > 0
    assert (neural_router / "router.safetensors").exists()
    assert set(card["drafters"]) == {"eagle3", "dflash"}  # the fingerprints a run compares with what it loads
    assert card["latency_dtype"] == "float32 on cpu"  # --dtype float32 (COMMON): a bf16 run would be warned
    sweep = pd.read_csv(neural_router / "sweep.csv")
    assert len(sweep) >= 7 and (neural_router / "sensitivity.png").exists()
    assert sweep.tokens_per_s.notna().all() and round(card["threshold"], 4) in set(sweep.threshold.round(4))  # what was drawn


@pytest.mark.slow
def test_chain_3_run_loads_the_calibrated_router(neural_router, tmp_path):
    run_cli("--method", "whiflash-neural", "--drafter", f"whiflash-neural={neural_router}", "--limit", "1",
            "--max-new-tokens", "24", "--warmup", "0", "--out", str(tmp_path / "wn"))
    assert read_table(tmp_path / "wn", "rounds").router_score.notna().all()


@pytest.mark.slow
def test_hvd_calibration_makes_a_predictor_run_loads(tmp_path):
    from specbench_methods.hvd import FEATURES

    cal = tmp_path / "cal"
    result = CliRunner().invoke(app, ["calibrate", "--method", "hvd", *COMMON, "--prompts", "3", "--max-new-tokens",
                                      "16", "--steps", "20", "--out", str(cal), "--work", str(tmp_path / "work")])
    assert result.exit_code == 0, result.output
    card = json.loads((cal / "config.json").read_text())
    assert card["features"] == list(FEATURES) and card["threshold"] == 6.0 and card["train_positions"] > 0
    assert set(card["heldout_simulated"]) == {"eagle3", "cache-first", "hvd-freq", "hvd"}
    assert 0 <= card["heldout_quality"]["p_high"] <= 1 and (cal / "predictor.safetensors").exists()
    run_cli("--method", "hvd", "--drafter", f"hvd={cal}", "--opt", "threshold=0", "--limit", "1",
            "--max-new-tokens", "24", "--warmup", "0", "--out", str(tmp_path / "hvd"))
    rounds = read_table(tmp_path / "hvd", "rounds")
    assert set(rounds.proposer) == {"suffix", "eagle3"}, f"hvd never switched: {set(rounds.proposer)}"
    assert (rounds.features.str.count(",") == len(FEATURES) - 1).all()
