"""The greedy replay (specbench_cli/greedy_replay.py): every emitted token against the reference target's choice."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specbench_cli.analysis import gate, report, summary
from specbench_cli.analysis.results import load
from specbench_cli.cli import app
from specbench_cli.records import read_table
from specbench_cli.greedy_replay import CHAIN, Replayed, Replayer
from tests.conftest import THREADS, needs_embedded, tiny_model
from tests.fake_runs import Turn, write_run
from tests.helpers import OracleTree, baseline_output, random_prompt, run_method, tree_opts

CPU = torch.device("cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_batch_invariant_baseline_replays_with_no_token_off(dtype):
    """The reference is the batch-invariant target: a greedy decode of it replays exactly, over several of the
    replay's chains (the output is longer than CHAIN)."""
    model = tiny_model("llama").to(dtype)
    prompt = random_prompt(30, seed=4)
    output = baseline_output(model, prompt, CHAIN * 2 + 5, invariant=True)
    assert len(output) > CHAIN * 2
    assert Replayer(model, CPU).check(prompt, output) == Replayed(len(output), 0, 0, -1, 0.0)


def test_a_token_the_target_would_not_choose_is_a_mismatch_at_its_position():
    model = tiny_model("qwen3")
    prompt = random_prompt(30, seed=5)
    output = baseline_output(model, prompt, 90, invariant=True)
    replayer = Replayer(model, CPU)
    with torch.inference_mode():  # the token the target likes least after the first 70 output tokens
        logits = model(input_ids=torch.tensor([prompt + output[:70]])).logits[0, -1]
    wrong = output[:70] + [int(logits.argmin())] + output[71:]
    got = replayer.check(prompt, wrong)
    assert (got.checked, got.first_off, got.ties) == (90, 70, 0)
    assert got.off >= 1 and got.mismatches >= 1 and got.margin > 0.1  # a tiny random model: flat logits
    assert replayer.check(prompt, output).off == 0  # the replayer is reusable: a new prefill each turn


def test_a_bf16_method_on_the_plain_target_replays_with_ties_only():
    """A drafter that accepts often, verified on the plain bf16 target (rows rounded by the row count): what
    differs from exact greedy decoding is within the tie threshold, and the timed output is what it is."""
    model = tiny_model("llama").to(torch.bfloat16)
    prompt = random_prompt(40, seed=11)
    reference = baseline_output(model, prompt, 120, invariant=True)
    result = run_method(model, OracleTree(reference, 96, seed=1), prompt, max_new=120)
    got = Replayer(model, CPU).check(prompt, result.output_ids)
    assert got.checked == len(result.output_ids) and got.mismatches == 0


def test_report_counts_replays_and_the_gate_fails_a_mismatch(tmp_path):
    ids = [5, 6, 7, 8]
    write_run(tmp_path / "base", "baseline", [Turn("A", "qa", [0] * 3, 300.0, depth=0, ids=ids,
                                                   replay=Replayed(4, 1, 1, 2, 0.06))], settings={"dtype": "bfloat16"},
              more={"replay": "batch-invariant target (exact)"})
    write_run(tmp_path / "tie", "pld", [Turn("A", "qa", [1, 1], 200.0, ids=[5, 6, 9, 8],
                                             replay=Replayed(4, 1, 1, 2, 0.12))], settings={"dtype": "bfloat16"})
    write_run(tmp_path / "bug", "suffix", [Turn("A", "qa", [1, 1], 200.0, ids=[5, 6, 99, 8],
                                                replay=Replayed(4, 2, 1, 2, 3.5))], settings={"dtype": "bfloat16"})
    results = load([tmp_path])
    table = report.replay(results).frame.set_index("method")
    assert table.loc["baseline", "reference"] == "batch-invariant target (exact)"
    assert (table.loc["pld", "tokens"], table.loc["pld", "numeric ties"], table.loc["pld", "mismatches"]) == (4, 1, 0)
    assert table.loc["suffix", "mismatches"] == 1 and table.loc["suffix", "first off (prompt/turn@token)"] == "A/0@2"
    # the lossless table reads the replays: no float32 classifier is asked
    lossless = report.lossless(results, lambda *args: pytest.fail("classifier asked")).frame.set_index("method")
    assert (lossless.loc["pld", "numeric ties"], lossless.loc["pld", "mismatches"]) == (1, 0)
    assert lossless.loc["suffix", "mismatches"] == 1
    failed = gate.compare(results, results, 5.0, None, report.replay(results)).failed
    assert len(failed) == 1 and "suffix" in failed[0] and "A/0@2" in failed[0]


def test_another_engines_replays_are_its_numerics_weighed_against_its_own_baseline(tmp_path):
    """vLLM's baseline replayed on our target: its off tokens are vLLM's numerics (it does not speculate), one of
    them past our bf16 threshold; a vLLM method's turn within that baseline's largest margin is ties, one past it
    a mismatch (issue 69: a baseline once read "1 MISMATCH(ES) ... a lossless bug")."""
    bf16, vllm = {"dtype": "bfloat16", "engine": "vllm"}, {"replay": "batch-invariant target (exact)"}
    base = [Turn("A", "qa", [0] * 3, 300.0, depth=0, ids=[5, 6, 7, 8], replay=Replayed(4, 2, 1, 1, 0.75)),
            Turn("B", "qa", [0] * 3, 300.0, depth=0, ids=[5, 6, 7, 8], replay=Replayed(4, 0, 0, -1, 0.0))]
    write_run(tmp_path / "base", "baseline", base, settings=bf16, more=vllm)
    write_run(tmp_path / "sfx", "suffix", [Turn("A", "qa", [1, 1], 200.0, ids=[5, 6, 7, 8], replay=Replayed(4, 1, 0, 1, 0.7)),
                                           Turn("B", "qa", [1, 1], 200.0, ids=[5, 9, 7, 8], replay=Replayed(4, 1, 0, 1, 2.0))],
              settings=bf16, more=vllm)
    results = load([tmp_path])
    table = report.replay(results).frame.set_index("method")
    assert (table.loc["vllm:baseline", "numeric ties"], table.loc["vllm:baseline", "mismatches"]) == (2, 0)
    assert table.loc["vllm:baseline", "tie threshold"] == "none: vllm's baseline does not speculate"
    assert (table.loc["vllm:suffix", "numeric ties"], table.loc["vllm:suffix", "mismatches"]) == (1, 1)
    assert table.loc["vllm:suffix", "tie threshold"] == "vllm baseline's 0.75 logits"
    lossless = report.lossless(results, lambda *args: pytest.fail("classifier asked")).frame.set_index("method")
    assert lossless.loc["vllm:suffix", "mismatches"] == 1 and lossless.loc["vllm:suffix", "numeric ties"] == 0
    line = summary.replay_line(results.groups[0].prompts, results.groups[0].info)
    assert "2 token(s) off, largest margin 0.75 logits: vllm's numerics against ours" in line and "MISMATCH" not in line


def test_another_engines_speculating_turns_are_weighed_against_its_measured_verify_error(tmp_path):
    """Where the engine scored its turns (its verify of each against our reference: `engine_error`), that error,
    not its baseline's largest margin, says what is a tie: a turn within it has ties, a turn past it a mismatch."""
    bf16, vllm = {"dtype": "bfloat16", "engine": "vllm"}, {"replay": "batch-invariant target (exact)"}
    write_run(tmp_path / "base", "baseline", [Turn("A", "qa", [0] * 3, 300.0, depth=0, ids=[5, 6, 7, 8],
                                                   replay=Replayed(4, 1, 0, 1, 3.0))], settings=bf16, more=vllm)
    write_run(tmp_path / "sfx", "suffix", [Turn("A", "qa", [1, 1], 200.0, ids=[5, 6, 7, 8],
                                                replay=Replayed(4, 1, 0, 1, 0.7, engine_error=0.4)),
                                           Turn("B", "qa", [1, 1], 200.0, ids=[5, 9, 7, 8],
                                                replay=Replayed(4, 1, 0, 1, 2.0, engine_error=1.0))],
              settings=bf16, more=vllm)
    results = load([tmp_path])
    table = report.replay(results).frame.set_index("method")
    assert (table.loc["vllm:suffix", "numeric ties"], table.loc["vllm:suffix", "mismatches"]) == (1, 1)
    assert table.loc["vllm:suffix", "tie threshold"] == "vllm's verify against ours on these turns, 1 logits"
    sfx = next(g for g in results.groups if g.method == "suffix")
    assert "its verify is within 1 logits of ours on these turns" in summary.replay_line(sfx.prompts, sfx.info)


def test_an_engines_error_is_the_largest_margin_error_among_its_scored_tokens():
    """`engine_error`: log-probabilities that are the reference's up to each row's normaliser read 0; one token
    moved by 0.3 logits reads 0.3 (a margin to it moves by that much), whatever the normaliser."""
    from specbench_cli.greedy_replay import engine_error

    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 4
    lp = torch.log_softmax(logits, -1)
    same = [{t: float(row[t]) + 2.0 for t in row.topk(5).indices.tolist()} for row in lp]
    assert engine_error(logits, same) == pytest.approx(0.0, abs=1e-6)
    moved = [dict(d) for d in same]
    token = next(iter(moved[1]))
    moved[1][token] += 0.3
    assert engine_error(logits, moved) == pytest.approx(0.3, abs=1e-5)


@pytest.mark.slow
@needs_embedded
def test_plain_bf16_runs_are_replayed(tmp_path):
    """A bf16 CPU run on the plain target (`--batch-invariant off`; the default where the row kernel does not build)
    replays every turn on the batch-invariant one: only numeric ties off, in a single run and in a batch (replayed
    after its last round, rows rewritten); `--no-replay` records none."""
    # --no-replay needs no long answers to show that nothing was replayed: one prompt, a few tokens (CI time)
    runs = {"single": [], "batch": ["--batch-size", "2"], "none": ["--no-replay", "--limit", "1", "--max-new-tokens", "8"]}
    tree = tree_opts(16, 4, 4)  # bf16 without bf16 instructions: CI time
    for name, extra in runs.items():
        result = CliRunner().invoke(app, ["run", "--method", "eagle3", *tree, "--dtype", "bfloat16", "--limit", "2",
                                          "--max-new-tokens", "24", "--warmup", "0", "--threads", THREADS,
                                          "--batch-invariant", "off", "--out", str(tmp_path / name), *extra])
        assert result.exit_code == 0, result.output
        info = json.loads((tmp_path / name / "run.json").read_text())
        assert info["settings"]["batch_invariant"] is False
        prompts = read_table(tmp_path / name, "prompts")
        if name == "none":
            assert info["replay"] == "off" and (prompts.replay_checked == -1).all()
            continue
        assert info["replay"] == "batch-invariant target (exact)"
        assert "greedy replay on the batch-invariant target (exact): " in result.output  # the summary's line
        assert (prompts.replay_checked == prompts.new_tokens).all()
        assert (prompts.replay_off == prompts.replay_ties).all()
