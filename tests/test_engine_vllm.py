"""`specbench run --engine vllm` against a real vLLM engine (the CPU build `scripts/setup-vllm.sh` installs).

At float32 and temperature 0 every mapped method's outputs must equal our own engine's baseline, turn by turn
(the two-turn prompt included), and so must transformers' generate and vLLM at two requests in flight; the model itself as a draft model must have every draft accepted.
Without the engine these tests skip, unless SPECBENCH_REQUIRE_ENGINES=1 (CI), where they fail.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench_cli.cli import app

from tests.helpers import Background

pytestmark = [pytest.mark.engine, pytest.mark.embedded]

TOKENS = "24"
SELECTION = ["--model", "smollm2-135m", "--dataset", "spec-bench", "--category", "writing", "--category",
             "summarization", "--limit", "2", "--max-new-tokens", TOKENS, "--warmup", "0", "--dtype", "float32",
             "--threads", "1"]  # one OpenMP thread: a spinning pool on a busy core crawls
# eager: a first vLLM start on CPU compiles for a long time per speculative config; the tests check outputs, not speed
ENGINE = ["--engine", "vllm", "--engine-arg", "enforce_eager=true"]
# a run whose outputs a test compares with our baseline's needs no replay (the fixture's vLLM list is replayed)
UNREPLAYED = ["--no-replay"]
METHODS = {"baseline": [], "pld": [], "suffix": [],
           "eagle3": ["--opt", "top_k=1", "--opt", "depth=2", "--opt", "total_token=4"],  # a chain of 3
           "dflash": [], "sps": []}


def run(*args: str) -> None:
    result = CliRunner().invoke(app, ["run", *SELECTION, *args])
    assert result.exit_code == 0, result.output


CROSS = ("eagle3", "dflash")  # run in both engines for the step-by-step check
LEVELS = "2"  # a second concurrency level (2 prompts: at most 2 in flight) for baseline and eagle3


def in_list(*methods: str) -> list[str]:
    """METHODS' options as a list of methods takes them: each --opt names its method (`--opt eagle3.top_k=1`)."""
    return [a for m in methods for opt in METHODS.get(m, [])[1::2] for a in ("--opt", f"{m}.{opt}")]


# the vLLM methods but baseline and eagle3 as one list (an engine each, booted side by side, ~10 GB in all); the
# fixture's tune runs baseline and eagle3's chain of 3 at one request in flight, the runs the tests read for them
VLLM_LIST = ("pld", "suffix", "dflash", "sps")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, engine_python, embedded) -> dict:
    """Our engine's baseline, hf-generate and the CROSS methods as one list on one loaded target, in a process of
    its own meanwhile (`Background`); vLLM's mapped methods as one list and the tune's runs; baseline and eagle3
    also at two requests in flight (the tune's). "root" holds our runs and the list."""
    root = tmp_path_factory.mktemp("engine_runs")
    ours = ("baseline", "hf-generate", *CROSS)
    beside = Background("run", *SELECTION, *UNREPLAYED, "--method", ",".join(ours), *in_list(*ours),
                        "--out", str(root / "ours"))
    out = {"root": root, "ours": root / "ours" / "baseline", "hf-generate": root / "ours" / "hf-generate",
           **{f"ours-{m}": root / "ours" / m for m in CROSS}}
    run("--method", ",".join(VLLM_LIST), *ENGINE, "--engine-python", engine_python, *in_list(*VLLM_LIST),
        "--out", str(root / "vllm"))
    out |= {m: root / "vllm" / m for m in VLLM_LIST}
    out |= tuned_in_vllm(tmp_path_factory.mktemp("tune_vllm") / "t", engine_python)
    beside.wait()
    return out


def tuned_in_vllm(folder, engine_python) -> dict:
    """`tune --engine vllm --method eagle3 --concurrency 1,LEVELS` over the paper chain and METHODS' chain of 3:
    baseline and eagle3 (the chain of 3: candidate_1) at both levels (engines started once), the table, and its
    check (`run --engine vllm --tuned` beside the baseline and the paper chain again)."""
    from specbench_cli import budgets

    chain = tuple(METHODS["eagle3"][1::2])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECBENCH_CACHE", str(folder.parent / "cache"))
        patch.setitem(budgets.VLLM_GRIDS, "eagle3", [chain])
        result = CliRunner().invoke(app, ["tune", "--method", "eagle3", "--concurrency", f"1,{LEVELS}",
                                          *SELECTION[:-2], "--threads", "1", *ENGINE, "--engine-python", engine_python,
                                          "--out", str(folder)])
        assert result.exit_code == 0, result.output
    return {"tune": folder, "baseline": folder / "c1" / "baseline", "eagle3": folder / "c1" / "candidate_1",
            f"baseline-c{LEVELS}": folder / f"c{LEVELS}" / "baseline",
            f"eagle3-c{LEVELS}": folder / f"c{LEVELS}" / "candidate_1",
            f"tuned-c{LEVELS}": folder / "check" / f"c{LEVELS}" / "tuned"}


def outputs(run_dir) -> dict:
    prompts = pd.read_parquet(run_dir / "prompts.parquet")
    return {(r.prompt_id, r.turn): (list(r.prompt_ids), list(r.output_ids)) for r in prompts.itertuples()}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["hf-generate", *METHODS, f"baseline-c{LEVELS}", f"eagle3-c{LEVELS}",
                                    f"tuned-c{LEVELS}"])
def test_vllm_outputs_equal_our_baseline_turn_by_turn(runs, method):
    ours, theirs = outputs(runs["ours"]), outputs(runs[method])
    assert set(ours) == set(theirs) and any(turn == 1 for _, turn in ours)  # the two-turn prompt is there
    for key, (prompt_ids, output_ids) in ours.items():
        assert theirs[key][0] == prompt_ids, f"{method} {key}: the engine saw other prompt ids"
        assert theirs[key][1] == output_ids, f"{method} {key}: output differs from our baseline"


@pytest.mark.slow
@pytest.mark.parametrize("method", ["pld", "suffix", "eagle3", "dflash"])
def test_vllm_drafts_are_verified_and_some_accepted(runs, method):
    rounds = pd.read_parquet(runs[method] / "rounds.parquet")
    assert (rounds.tree_size > 0).any() and (rounds.accepted > 0).any()
    last = rounds.groupby(["prompt_id", "turn"])["round"].transform("max") == rounds["round"]
    assert (rounds.emitted[~last] == rounds.accepted[~last] + 1).all()
    assert (rounds.emitted[last] <= rounds.accepted[last] + 1).all()  # --max-new-tokens may cut the last step
    assert rounds.verify_ms.isna().all() and rounds.wall_ms.notna().all()  # no phases from the engine, never 0


@pytest.mark.slow
def test_the_engine_run_records_what_ran(runs):
    info = json.loads((runs["eagle3"] / "run.json").read_text())
    assert info["status"] == "complete" and info["engine"]["version"].startswith("0.")
    assert info["settings"]["engine"] == "vllm"
    assert info["settings"]["speculative_config"]["num_speculative_tokens"] == 3
    assert info["settings"]["speculative_config"]["method"] == "eagle3"
    assert info["engine"]["engine_args"]["enforce_eager"] is True
    assert info["throughput"]["output_tokens"] > 0
    prompts = pd.read_parquet(runs["eagle3"] / "prompts.parquet")
    assert (prompts.engine == "vllm").all() and (prompts.ttft_ms > 0).all() and (prompts.tokens_per_s > 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("method", VLLM_LIST)
def test_a_vllm_runs_greedy_turns_are_replayed_on_our_exact_reference_once_the_engine_stopped(runs, method):
    info = json.loads((runs[method] / "run.json").read_text())
    assert info["replay"] == "batch-invariant target (exact)"
    prompts = pd.read_parquet(runs[method] / "prompts.parquet")
    assert (prompts.replay_checked == prompts.new_tokens).all() and (prompts.new_tokens > 0).all()
    assert (prompts.replay_off == prompts.replay_ties).all(), prompts[["prompt_id", "turn", "replay_off", "replay_ties"]]
    # vLLM scored each turn before it stopped: its verify of the turn is within float32 rounding of our reference
    # (a misaligned position would read logits apart)
    assert prompts.replay_engine_error.between(0, 0.05).all(), prompts.replay_engine_error


@pytest.mark.slow
def test_a_run_on_an_engine_shared_by_a_tune_is_not_replayed(runs):
    assert json.loads((runs["baseline"] / "run.json").read_text())["replay"] == "off"
    assert (pd.read_parquet(runs["baseline"] / "prompts.parquet").replay_checked == -1).all()


@pytest.mark.slow
def test_report_puts_vllm_runs_beside_ours_with_their_own_baseline(runs):
    from specbench_cli.analysis.results import load

    results = load([runs["root"], runs["tune"]])
    groups = {g.label: g for g in results.groups}
    # two concurrency levels of vllm:baseline and vllm:eagle3 (the tune's): their labels say which
    assert {"baseline", "vllm:baseline (concurrency=1)", "vllm:baseline (concurrency=2)", "vllm:dflash"} <= set(groups)
    assert any(label.startswith("vllm:eagle3[") and "top_k=1" in label for label in groups)
    assert results.baseline_for(groups["vllm:dflash"]) is groups["vllm:baseline (concurrency=1)"]


def cross_engine_rows(runs, method: str):
    from specbench_cli.analysis import cross_engine
    from specbench_cli.analysis.results import load

    frame = cross_engine.table(load([runs["root"], runs["eagle3"]])).frame
    return frame[frame.method.str.startswith(method)]


@pytest.mark.slow
def test_our_eagle3_chain_and_vllms_accept_the_same_at_every_step(runs):
    rows = cross_engine_rows(runs, "eagle3")
    assert len(rows) == 3  # 2 prompts, one of them two turns
    assert rows["prompt ids equal"].all() and rows["output ids equal"].all()
    assert rows["accepts equal"].all(), rows.to_string()
    assert (rows["steps ours"] == rows["steps engine"]).all()


@pytest.mark.slow
def test_our_dflash_and_vllms_agree_or_differ_by_the_known_cpu_kernel_defect(runs, engine_python, tmp_path):
    """Steps that differ are named with the known cause, and on vLLM 0.32's CPU build that cause is shown to be
    real: its grouped RMSNorm normalises layer 1 with layer 0's weight (tests/engine_side/rms_norm_probe.py). On
    these short prompts the defect need not change an accepted count; on others it does (docs/engines.md)."""
    import subprocess
    from pathlib import Path

    rows = cross_engine_rows(runs, "dflash")
    assert len(rows) == 3 and rows["output ids equal"].all()
    differ = rows[~rows["accepts equal"]]
    assert (differ["known engine cause"].str.contains("rms_norm")).all(), rows.to_string()
    probe = subprocess.run([engine_python, str(Path(__file__).parent / "engine_side" / "rms_norm_probe.py")],
                           cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert probe.returncode == 0, probe.stderr[-2000:]
    kernel = json.loads(probe.stdout.strip().splitlines()[-1])
    version = json.loads((runs["dflash"] / "run.json").read_text())["engine"]["version"]
    assert kernel["per_layer"][0]
    if version.startswith("0.32"):
        assert kernel["layer_1_used_layer_0_weight"], kernel  # the defect KNOWN_DIFFERENCES names


@pytest.mark.slow
def test_the_concurrency_tables_and_figure(runs, tmp_path):
    from specbench_cli.analysis import scaling
    from specbench_cli.analysis.report import figures
    from specbench_cli.analysis.results import load

    results = load([runs["root"], runs["tune"]])
    frame = scaling.throughput_table(results, "concurrency").frame
    vllm = frame[frame.engine == "vllm"].set_index("concurrency")
    assert list(vllm.index) == [1, int(LEVELS)]
    speedup = next(c for c in vllm.columns if c.startswith("eagle3[") and c.endswith(" ×"))
    assert (vllm["baseline tok/s"] > 0).all() and (vllm[speedup] > 0).all()
    info = json.loads((runs[f"eagle3-c{LEVELS}"] / "run.json").read_text())
    assert info["settings"]["concurrency"] == int(LEVELS)
    assert tmp_path / "throughput_vs_concurrency.png" in figures(results, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("method", CROSS)
def test_a_speculators_written_drafter_drafts_as_our_checkpoint_in_both_engines(runs, engine_python, tmp_path, method):
    """The committed drafter's weights saved by speculators' own `save_pretrained` (Eagle3DraftModel,
    DFlashDraftModel): our engine accepts, step by step, what it accepts with the original, and so does vLLM,
    except where vLLM 0.32 reads a speculators DFlash config otherwise (recorded, and shown to be the cause)."""
    import shutil
    import subprocess
    from pathlib import Path

    from specbench_cli.analysis import cross_engine
    from specbench_cli.analysis.results import load
    from specbench_cli.loading import embedded_folder

    root = Path(__file__).resolve().parents[1]
    folder = tmp_path / f"speculators-{method}"
    written = subprocess.run([engine_python, str(root / "tests" / "engine_side" / "speculators_writer.py"), method,
                              str(root / "drafters" / "smollm2-135m" / method), str(embedded_folder()), str(folder)],
                             cwd=tmp_path, capture_output=True, text=True)
    assert written.returncode == 0, written.stderr[-2000:]
    config = json.loads((folder / "config.json").read_text())
    assert config["speculators_model_type"] == method and "transformer_layer_config" in config
    original = load([runs[f"ours-{method}"]]).groups[0]
    vllm = [*ENGINE, "--engine-python", engine_python]

    def args(name: str, drafter: Path) -> list[str]:
        return ["--method", method, *METHODS[method], "--drafter", f"{method}={drafter}", *UNREPLAYED,
                "--out", str(tmp_path / name)]

    def steps(name: str):
        group = load([tmp_path / name]).groups[0]
        frame = cross_engine.compare(original, group)
        assert len(frame) == 3 and frame["output ids equal"].all(), name
        return frame, group

    assert (original.rounds.accepted > 0).any()  # drafts that accept, so equal steps say something
    beside = Background("run", *SELECTION, *args("ours", folder))  # our engine meanwhile, in a process of its own
    run(*args("vllm", folder), *vllm)
    beside.wait()
    ours, _ = steps("ours")
    assert ours["accepts equal"].all(), ours.to_string()
    theirs, group = steps("vllm")
    if method == "eagle3":
        assert theirs["accepts equal"].all(), theirs.to_string()
        return
    # vLLM 0.32 reads speculators' sliding_window_non_causal=false as a causal block in every layer: the run
    # records it, and with the flag set (meaningless for full-attention layers in speculators) every step matches
    assert "sliding_window_non_causal" in cross_engine.known_cause(group)
    fixed = tmp_path / "bidirectional"
    shutil.copytree(folder, fixed)
    config["sliding_window_non_causal"] = True
    (fixed / "config.json").write_text(json.dumps(config))
    run(*args("vllm-bidirectional", fixed), *vllm)
    patched, _ = steps("vllm-bidirectional")
    assert patched["accepts equal"].all(), patched.to_string()


@pytest.mark.slow
def test_vllm_serve_over_http_drafts_as_the_engine_loop_does(runs, engine_python, tmp_path):
    """--engine-serve: `vllm serve` started by specbench, measured over HTTP (streamed token-in/token-out)."""
    from specbench_cli.analysis import cross_engine
    from specbench_cli.analysis.results import load

    out = tmp_path / "served"
    run("--method", "eagle3", *METHODS["eagle3"], *ENGINE, "--engine-python", engine_python, "--engine-serve",
        *UNREPLAYED, "--out", str(out))
    assert outputs(out) == outputs(runs["ours"])
    steps = cross_engine.compare(load([runs["eagle3"]]).groups[0], load([out]).groups[0])
    assert len(steps) == 3 and steps["accepts equal"].all(), steps.to_string()
    info = json.loads((out / "run.json").read_text())
    assert info["engine"]["url"].startswith("http://127.0.0.1:") and "streamed" in info["clock"]


@pytest.mark.slow
def test_a_running_server_is_measured_and_one_started_otherwise_is_named(runs, engine_python, tmp_path):
    """--engine-url: a server the user started. A baseline run reproduces our baseline; an EAGLE-3 run against
    that server (started without speculation) stops in one line that gives the command it needs."""
    from specbench_cli.engines import vllm_server
    from specbench_cli.loading import embedded_folder

    args = {"model": str(embedded_folder()), "dtype": "float32", "seed": 0, "enforce_eager": True}
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    (tmp_path / "server").mkdir()
    server = vllm_server.start(engine_python, args, env, tmp_path / "server" / "engine.log",
                               vllm_server.Expect(False, ""))
    with server:
        run("--method", "baseline", "--engine", "vllm", "--engine-url", server.url, "--out", str(tmp_path / "base"))
        assert json.loads((tmp_path / "base" / "run.json").read_text())["settings"]["engine_url"] == server.url
        result = CliRunner().invoke(app, ["run", *SELECTION, "--method", "eagle3", "--engine", "vllm",
                                          "--engine-url", server.url, "--out", str(tmp_path / "eagle3")])
    assert server.process.poll() is not None  # stopped
    assert outputs(tmp_path / "base") == outputs(runs["ours"])
    assert result.exit_code == 2 and "sent no per-request speculative metrics" in result.output
    assert "vllm serve" in result.output and "--speculative-config" in result.output


@pytest.mark.slow
def test_an_engine_that_dies_mid_run_keeps_finished_prompts_and_resume_finishes(engine_python, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from specbench_cli.records import read_table

    out, prompts = tmp_path / "killed", 3
    args = ["run", *SELECTION, "--limit", str(prompts), "--max-new-tokens", "32", "--method", "baseline", *ENGINE,
            "--engine-python", engine_python, *UNREPLAYED, "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "specbench_cli.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.time() + 600
    while not list((out / "prompts.parquet").glob("part-*.parquet")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before its engine could be killed"
    os.kill(json.loads((out / "run.json").read_text())["engine"]["pid"], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2 and stderr.strip().splitlines()[-1].startswith("error: the vLLM process ended"), stderr
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and "vLLM process ended" in info["reason"]
    kept = read_table(out, "prompts")["index"].nunique()
    assert 1 <= kept < prompts
    result = CliRunner().invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete" and read_table(out, "prompts")["index"].nunique() == prompts


@pytest.mark.slow
def test_a_paired_list_in_vllm_repeats_from_fresh_caches_and_a_resume_absorbs_its_pass(engine_python, tmp_path):
    """`run --engine vllm --method baseline,suffix,sps --repeat 2`: an engine per method, each prompt to every one in
    turn. Within a pass the suffix cache carries a prompt's answer to the next prompt (b repeats a, and is drafted
    from a's cached output); a new pass starts from empty caches (the worker's "forget"), so pass 1 drafts as pass
    0 did; and vLLM resumes by absorbing, as our engine does: a member resumed after losing pass 1's b takes in
    pass 1's finished outputs only, and drafts b as the uninterrupted run did. The third member runs the target as
    its own draft model: every draft accepted. 32 tokens a prompt: at 24, a's last step verifies tokens past the
    budget, which vLLM's cache keeps and a resumed member cannot absorb (docs/engines.md), and b's last draft is
    shorter after the resume."""
    import shutil

    from specbench_cli.loading import embedded_folder

    data = tmp_path / "twice.jsonl"
    text = "Write a short poem about the sea."
    data.write_text("".join(json.dumps({"question_id": q, "turns": [text]}) + "\n" for q in ("a", "b")))
    args = ["run", "--model", "smollm2-135m", "--dataset", str(data), "--max-new-tokens", "32", "--warmup", "0",
            "--dtype", "float32", "--threads", "1", "--repeat", "2", *ENGINE, "--engine-python", engine_python, *UNREPLAYED]
    whole = tmp_path / "whole"
    result = CliRunner().invoke(app, [*args, "--method", "baseline,suffix,sps", "--drafter", f"sps={embedded_folder()}",
                                      "--opt", "sps.k=3", "--out", str(whole)])
    assert result.exit_code == 0, result.output

    def accepted(run_dir) -> dict:
        rounds = pd.read_parquet(run_dir / "rounds.parquet")
        return {k: list(g.sort_values("round").accepted) for k, g in rounds.groupby(["repeat", "prompt_id"])}

    info = json.loads((whole / "suffix" / "run.json").read_text())
    assert info["pairing"]["members"] == ["baseline", "suffix", "sps"] and info["pairing"]["passes"] == 2
    before = accepted(whole / "suffix")
    assert len(before[(0, "b")]) < len(before[(0, "a")])  # b was drafted from a's cached output within the pass
    assert before[(1, "a")] == before[(0, "a")] and before[(1, "b")] == before[(0, "b")]  # pass 1 from empty caches
    assert outputs(whole / "suffix") == outputs(whole / "baseline") == outputs(whole / "sps")
    rounds = pd.read_parquet(whole / "sps" / "rounds.parquet")
    last = rounds.groupby(["repeat", "prompt_id", "turn"])["round"].transform("max") == rounds["round"]
    assert (rounds[~last].accepted == 3).all() and (rounds.tree_size[~last] == 3).all()  # AL = k + 1

    resumed = tmp_path / "resumed"
    shutil.copytree(whole / "suffix", resumed)
    for table in ("rounds", "prompts"):  # killed after pass 1's a (part pass * 2 + index)
        (resumed / f"{table}.parquet" / "part-00003.parquet").unlink()
    (resumed / "run.json").write_text(json.dumps({**info, "status": "interrupted"}))
    result = CliRunner().invoke(app, [*args, "--method", "suffix", "--out", str(resumed), "--resume"])
    assert result.exit_code == 0, result.output
    assert accepted(resumed) == before


@pytest.mark.parametrize("max_depth, factor, min_prob", [(64, 1.0, 0.1), (8, 2.0, 0.0)])
def test_our_suffix_drafts_what_arcticinference_drafts(engine_python, tmp_path, monkeypatch, max_depth, factor,
                                                     min_prob):
    """Random token streams over tiny vocabularies (so equally frequent continuations are common), drafted by
    our `speculate` and by ArcticInference's SuffixDecodingCache itself (tests/engine_side/suffix_probe.py), as
    vLLM's suffix proposer and our suffix method use them at batch 1: the request's own tree (prompt + response)
    and the global one (earlier responses and this one), the global draft only if strictly better."""
    import random
    import subprocess
    from pathlib import Path

    from specbench_methods.suffix import SpecParams, TokenStore, speculate

    rng = random.Random(max_depth)
    params = SpecParams(max_depth=max_depth, max_spec_tokens=16, max_spec_factor=factor, min_token_prob=min_prob,
                        tree=False)
    cases = []
    for _ in range(60):
        vocab = rng.choice([2, 3, 5])
        seq = lambda lo, hi: [rng.randrange(vocab) for _ in range(rng.randint(lo, hi))]  # noqa: E731
        cases.append({"earlier": [seq(1, 40) for _ in range(rng.randint(0, 3))], "prompt": seq(2, 50),
                      "response": seq(1, 30)})
    for case in cases:
        case["pattern_len"] = min(max_depth, len(case["prompt"]) + len(case["response"]))
    job = {"cases": cases, "max_depth": max_depth, "max_spec_tokens": 16, "max_spec_factor": factor,
           "min_token_prob": min_prob}
    probe = subprocess.run([engine_python, str(Path(__file__).parent / "engine_side" / "suffix_probe.py")],
                           input=json.dumps(job), cwd=tmp_path, capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr[-2000:]
    theirs = [json.loads(line) for line in probe.stdout.strip().splitlines()]
    assert len(theirs) == len(cases)

    def ours(case: dict):
        local, every = TokenStore(), TokenStore()
        local.extend(case["prompt"] + case["response"])
        for sequence in [*case["earlier"], case["response"]]:
            every.new_sequence()
            every.extend(sequence)
        pattern = (case["prompt"] + case["response"])[-case["pattern_len"]:]
        draft, other = speculate(local, pattern, params), speculate(every, pattern, params)
        return other if other.score > draft.score else draft

    for case, arctic in zip(cases, theirs):
        draft = ours(case)
        assert draft.tokens == arctic["tokens"], (case, arctic)
        assert draft.probs == pytest.approx(arctic["probs"], abs=1e-6)
    assert sum(bool(arctic["tokens"]) for arctic in theirs) > len(cases) // 2
    # the cases exercise ties: breaking them by the smaller token id instead drafts otherwise in some
    import specbench_methods.suffix

    monkeypatch.setattr(specbench_methods.suffix, "sibling_order",
                        lambda arrivals: sorted(set(arrivals), key=lambda t: (-arrivals.count(t), t)))
    assert any(ours(case).tokens != arctic["tokens"] for case, arctic in zip(cases, theirs))


@pytest.mark.slow
def test_tune_in_vllm_writes_vllms_table_and_a_tuned_run_uses_it(runs):
    """The fixture's `tune --engine vllm` (eagle3: the paper chain and a chain of 3, at 1 and 2 in flight): each
    budget measured at both levels, the choice per level written as vLLM's num_speculative_tokens_per_batch_size,
    and the check's `run --engine vllm --tuned`: an engine whose scheduler built that table, with the baseline's
    outputs (the output test above)."""
    folder = runs["tune"]
    record = json.loads((folder / "tune.json").read_text())
    assert record["engine"] == "vllm" and record["machine"] == "vllm-float32-cpu-1t"
    frame = pd.read_csv(folder / "candidates.csv")
    paper = int(frame.k.iloc[0])
    assert sorted(frame.k.unique()) == sorted({paper, 3}) and (frame.tokens_per_s > 0).all()
    ks = [level["k"] for level in record["levels"]]
    assert record["schedule"] == [[1, 1, ks[0]], [2, 2, ks[1]]]
    for n, k, level in zip((1, int(LEVELS)), ks, record["levels"]):
        assert k == frame[frame.load == n].sort_values("tokens_per_s").k.iloc[-1]  # the most tokens/s there
        info = json.loads((folder / "check" / f"c{n}" / "tuned" / "run.json").read_text())
        assert info["settings"]["speculative_config"]["num_speculative_tokens"] == max(ks)
        assert info["settings"]["speculative_config"]["num_speculative_tokens_per_batch_size"] == record["schedule"]
        assert info["engine"]["k_by_batch_size"][:2] == ks  # what vLLM's scheduler built from the table
        assert level["check_tuned_low"] <= level["check_tuned_speedup"] <= level["check_tuned_high"]
