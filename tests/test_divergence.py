"""Numeric ties vs mismatches: a divergence at a near-tie of the run's dtype is rounding, anything else is
a lossless bug; the classification reaches the report's lossless table and fails the regression gate."""

from __future__ import annotations

import copy

import pytest
import torch

from specbench_cli.analysis import gate, report
from specbench_cli.core import engine
from specbench_cli.core.acceptance import Acceptance
from specbench_cli.core.target import Target
from specbench_cli.analysis.divergence import TIE_THRESHOLD, classify
from specbench_cli.analysis.metrics import first_divergence
from specbench_cli.analysis.results import load
from tests.conftest import tiny_model
from tests.fake_runs import Turn, write_run
from tests.helpers import OracleTree, baseline_output, random_prompt, run_method


PREFIX = random_prompt(20, seed=2)


@pytest.fixture(scope="module")
def tied():
    """A tiny target whose top-2 after PREFIX are tokens 5 and 7, a whisper apart (7's head row is 5's plus noise)."""
    model = tiny_model("llama", seed=3)
    with torch.no_grad():
        hidden = model.model(torch.tensor([PREFIX])).last_hidden_state[0, -1]
        head = model.get_output_embeddings().weight
        head[5] = 3 * hidden / hidden.norm()  # logit 3|h|, far above the random rows
        head[7] = head[5] + 1e-4 * torch.randn_like(head[5])
    return model


def test_a_near_tie_is_numeric_and_a_wrong_token_is_a_mismatch(tied):
    prefix = PREFIX
    logits = tied(torch.tensor([prefix])).logits[0, -1]
    assert set(logits.topk(2).indices.tolist()) == {5, 7}
    assert classify(tied, prefix, 5, 7, "bfloat16").kind == "numeric tie"
    assert classify(tied, prefix, 7, 5, "float16").kind == "numeric tie"
    worst = int(logits.argmin())
    verdict = classify(tied, prefix, 5, worst, "bfloat16")
    assert verdict.kind == "mismatch" and verdict.margin > TIE_THRESHOLD["bfloat16"]


def broken_accept(tree, logits, temperature, generator=None) -> Acceptance:
    """A deliberately broken rule: accept the first child at every level without asking the target."""
    children, node, path, tokens = tree.children(), 0, [0], []
    while children[node]:
        node = children[node][0]
        path.append(node)
        tokens.append(tree.tokens[node - 1])
    return Acceptance(path, tokens + [int(logits[node].argmax())])


def test_a_broken_acceptance_rule_in_bfloat16_is_a_mismatch(monkeypatch):
    """bf16 on the CPU: the baseline and a method with a broken rule diverge, and the bf16 target's logits call it
    a bug. The head is scaled up: a tiny random model's logits are too flat for a wrong token to fall beyond bf16's
    threshold from the top."""
    model = tiny_model("llama", seed=5)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(30)
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    prompt = random_prompt(30, seed=6)
    reference = baseline_output(bf16, prompt, max_new=60)
    monkeypatch.setattr(engine, "accept_greedy_all",
                        lambda trees, logits, ahead=(): [broken_accept(t, lg, 0.0) for t, lg in zip(trees, logits)])
    drafts = OracleTree([t + 1 for t in reference], 96, seed=1, chain=True)  # every draft is wrong
    out = run_method(bf16, drafts, prompt, max_new=60, target=Target(bf16, torch.device("cpu"))).output_ids
    at = first_divergence(out, reference)
    assert at is not None
    verdict = classify(bf16, prompt + reference[:at], reference[at], out[at], "bfloat16")
    assert verdict.kind == "mismatch", verdict


def test_report_counts_ties_and_gates_on_mismatches(tmp_path):
    base = [Turn("A", "qa", [0] * 6, 600.0, depth=0, ids=[5, 6, 7, 8, 9, 10, 11]),
            Turn("B", "rag", [0] * 3, 300.0, depth=0, ids=[1, 2, 3, 4])]
    base.append(Turn("A", "qa", [0] * 2, 200.0, depth=0, ids=[3, 4, 5], turn=1, prompt_ids=[1, 2, 3, 8]))
    mine = [Turn("A", "qa", [2, 2], 200.0, ids=[5, 6, 7, 99, 9, 10, 11]), Turn("B", "rag", [1, 0], 100.0, ids=[1, 2, 42, 4]),
            Turn("A", "qa", [1], 100.0, ids=[3, 9, 5], turn=1, prompt_ids=[1, 2, 3, 99])]  # turn 0's answer differs
    write_run(tmp_path / "base", "baseline", base)
    write_run(tmp_path / "m", "pld", mine)
    seen = []

    def stub(info, prefix, baseline_token, method_token):  # 99 is a near-tie of 8 here, 42 is not of 3
        seen.append((prefix, baseline_token, method_token))
        return "numeric tie" if method_token == 99 else "mismatch"

    results = load([tmp_path])
    table = report.lossless(results, stub)
    r = table.frame.set_index("method").loc["pld"]
    assert (r["numeric ties"], r["mismatches"], r["inherited"], r["unclassified"]) == (1, 1, 1, 0)
    assert ([1, 2, 3, 5, 6, 7], 8, 99) in seen  # the prompt, then the baseline's output up to the divergence
    problems = gate.compare(results, results, 5.0, table).failed
    assert len(problems) == 1 and "B/0@2 MISMATCH" in problems[0]
    assert report.lossless(results).frame.set_index("method").loc["pld", "unclassified"] == 2  # no classifier


def test_batch_invariant_runs_admit_no_ties(tmp_path):
    """Two batch-invariant runs in one dtype compute every row as a one-token decode: any greedy divergence is
    a mismatch, whatever a float32 recomputation says of the margin there."""
    exact = {"dtype": "bfloat16", "batch_invariant": True}
    write_run(tmp_path / "base", "baseline", [Turn("A", "qa", [0] * 3, 300.0, depth=0, ids=[5, 6, 7, 8])], settings=exact)
    write_run(tmp_path / "m", "pld", [Turn("A", "qa", [1, 1], 200.0, ids=[5, 6, 99, 8])], settings=exact)
    row = report.lossless(load([tmp_path]), lambda *args: "numeric tie").frame.set_index("method").loc["pld"]
    assert (row["numeric ties"], row["mismatches"]) == (0, 1)


def test_a_target_that_is_not_here_leaves_divergences_unclassified(capsys):
    from specbench_cli.analysis.divergence import run_classifier

    info = {"settings": {"model": "nowhere", "target": "/no/such/folder", "dtype": "bfloat16"}}
    assert run_classifier()(info, [1, 2], 3, 4) == "unclassified"
    assert "stay unclassified" in capsys.readouterr().err
