"""`--acceptance synthetic:RATE | profile:FILE`: the accept decision set by the user, at full draft and verify cost."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specbench_cli.cli import app
from specbench_cli.core.acceptance import SyntheticAcceptance
from specbench_cli.core.errors import UsageError
from specbench_cli.core.tree import DraftTree
from specbench_cli.inputs import parse_acceptance
from tests.conftest import needs_embedded

VOCAB = 32


def mean_length(acceptance: SyntheticAcceptance, tree: DraftTree, rounds: int) -> float:
    logits = torch.randn(len(tree) + 1, VOCAB, generator=torch.Generator().manual_seed(0))
    return sum(len(acceptance.accept(tree, logits, 0.0).tokens) for _ in range(rounds)) / rounds


def test_a_chain_accepts_each_position_with_its_rate_given_its_parent():
    chain = DraftTree.chain([3, 4, 5, 6])
    expected = 1 + 0.7 + 0.7 ** 2 + 0.7 ** 3 + 0.7 ** 4  # tokens a round: the accepted ones and the bonus
    assert mean_length(SyntheticAcceptance((0.7,), seed=1), chain, 20000) == pytest.approx(expected, rel=0.02)
    rates = (0.9, 0.5, 0.2)  # per position; the last one for deeper positions
    expected = 1 + 0.9 + 0.9 * 0.5 + 0.9 * 0.5 * 0.2 + 0.9 * 0.5 * 0.2 * 0.2
    assert mean_length(SyntheticAcceptance(rates, seed=2), chain, 20000) == pytest.approx(expected, rel=0.02)


def test_a_tree_is_walked_along_first_children_and_the_bonus_is_the_targets():
    tree = DraftTree([7, 8, 9, 10], [0, 0, 1, 2])  # root -> 1 (7) -> 3 (9); root -> 2 (8) -> 4 (10)
    logits = torch.zeros(5, VOCAB)
    logits[:, 11] = 1.0
    result = SyntheticAcceptance((1.0,)).accept(tree, logits, 0.0)
    assert (result.path, result.tokens) == ([0, 1, 3], [7, 9, 11])
    runs = [[a.accept(tree, logits, 0.0).tokens for _ in range(50)]
            for a in (SyntheticAcceptance((0.5,), seed=4), SyntheticAcceptance((0.5,), seed=4))]
    assert runs[0] == runs[1] and len({len(t) for t in runs[0]}) == 3  # the decisions follow the seed


def test_spellings_and_bad_rates(tmp_path):
    assert parse_acceptance("synthetic:0.7").rates == (0.7,)
    assert parse_acceptance(None) is None
    profile = tmp_path / "speculation_profile.json"
    profile.write_text(json.dumps({"conditional_accept_rates": [0.8, 0.6, 0.5]}))
    assert parse_acceptance(f"profile:{profile}").rates == (0.8, 0.6, 0.5)
    (tmp_path / "empty.json").write_text(json.dumps({"conditional_accept_rates": []}))
    (tmp_path / "none.json").write_text(json.dumps({"mean_accept_length": 2.0}))
    (tmp_path / "broken.json").write_text("{")
    for text, says in (("synthetic:0", "(0, 1]"), ("synthetic:1.5", "(0, 1]"), ("synthetic:x", "(0, 1]"),
                       ("always", "expected synthetic:RATE"), (f"profile:{tmp_path / 'missing.json'}", "unreadable"),
                       (f"profile:{tmp_path / 'none.json'}", "no conditional_accept_rates"),
                       (f"profile:{tmp_path / 'broken.json'}", "unreadable"),
                       (f"profile:{tmp_path / 'empty.json'}", "non-empty list")):
        with pytest.raises(UsageError) as err:
            parse_acceptance(text)
        assert says in str(err.value), text


@pytest.mark.parametrize("args, says", [
    (["--acceptance", "synthetic:2"], "(0, 1]"),
    (["--method", "baseline", "--acceptance", "synthetic:0.5"], "never drafts"),
    (["--method", "hf-generate", "--acceptance", "synthetic:0.5"], "never drafts"),
])
def test_bad_acceptance_exits_2_in_one_line_before_a_model_loads(tmp_path, args, says):
    result = CliRunner().invoke(app, ["run", "--method", "suffix", "--limit", "1", "--out", str(tmp_path / "r"), *args])
    assert result.exit_code == 2 and says in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
@needs_embedded
def test_a_synthetic_run_is_labelled_not_replayed_and_left_out_of_the_lossless_table(tmp_path):
    common = ["--limit", "1", "--warmup", "0", "--max-new-tokens", "12", "--threads", "2"]
    for method, more in (("baseline", ["--no-replay"]), ("suffix", ["--acceptance", "synthetic:0.9"])):
        result = CliRunner().invoke(app, ["run", "--method", method, *common, *more, "--out", str(tmp_path / method)])
        assert result.exit_code == 0, result.output
    info = json.loads((tmp_path / "suffix" / "run.json").read_text())
    assert info["settings"]["acceptance"] == "synthetic:0.9" and info["replay"].startswith("off: --acceptance")
    result = CliRunner().invoke(app, ["report", str(tmp_path), "--no-plots", "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    lossless = (tmp_path / "report" / "lossless.md").read_text()
    assert "suffix@synthetic:0.9" in lossless and "not lossless by construction" in lossless
    assert "suffix@synthetic:0.9" in (tmp_path / "report" / "overview.md").read_text()


def test_in_a_method_list_it_prices_the_methods_that_draft_beside_the_plain_baseline(tmp_path):
    from specbench_cli.commands.interleave import member_configs
    from specbench_cli.inputs import RunConfig

    def members(method: str, *entries: str) -> dict[str, list[str]]:
        config = RunConfig(method=method, acceptance=list(entries), out=tmp_path / "r")
        return {c.method: c.acceptance for c in member_configs(config, "1", "1")}

    assert members("baseline,suffix", "synthetic:0.5") == {"baseline": [], "suffix": ["synthetic:0.5"]}
    assert members("baseline,suffix,pld", "synthetic:0.5", "pld.synthetic:0.75") == {
        "baseline": [], "suffix": ["synthetic:0.5"], "pld": ["synthetic:0.75"]}  # a method's own entry first
    for entries, says in ((["eagle3.synthetic:0.5"], "not a method of this run"),
                          (["synthetic:0.5", "synthetic:0.6"], "name each"),
                          (["pld.synthetic:0.5", "pld.synthetic:0.6"], "two entries for pld")):
        with pytest.raises(UsageError) as err:
            members("baseline,pld", *entries)
        assert says in str(err.value)


def test_vllm_takes_it_as_its_own_synthetic_sampler_with_unconditional_rates():
    from specbench_cli.engines.vllm import synthetic_config

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    config = synthetic_config({"method": "ngram", "num_speculative_tokens": 4}, (0.9, 0.5), "pld", cuda)
    assert config["rejection_sample_method"] == "synthetic"
    assert config["synthetic_acceptance_rates"] == pytest.approx([0.9, 0.45, 0.225, 0.1125])
    with pytest.raises(UsageError, match="fixed length"):
        synthetic_config(None, (0.5,), "baseline", cuda)
    with pytest.raises(UsageError, match="CPU engine"):  # vLLM's CPU sampling asserts it away
        synthetic_config({"method": "ngram", "num_speculative_tokens": 4}, (0.9,), "pld", cpu)
