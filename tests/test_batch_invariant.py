"""A batch-invariant target computes every verify row bit for bit as a one-token decode computes it.

In bf16 a plain verify does not: its GEMMs and attention take other code paths for more rows and a longer
attended span, so a lossless method's output leaves the bf16 baseline's at near-ties. With
`Target(invariant=True)` the logits of every row of a chain and of a tree (each node's keys laid out as the
decode at its position lays them out, `core.target.decode_layouts`) equal those of decoding its path one token
at a time, and so a method's bf16 output equals the bf16 baseline's exactly, with no second verify of a tree's
accepted path (`Target.verify_path`, kept where attention runs through SDPA: float32, CUDA).
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from typer.testing import CliRunner

from specbench_cli.cli import app
from specbench_cli.core.errors import UsageError
from specbench_cli.core.kernels import can_pack
from specbench_cli.core.target import Target
from specbench_cli.core.tree import DraftTree
from specbench_cli.core.row_attention import kernel
from specbench_cli.loading import resolve_invariant
from specbench_cli.records import read_table
from tests.conftest import needs_embedded, tiny_model
from tests.helpers import OracleTree, assert_lossless, baseline_output, random_prompt, tree_opts
from tests.test_verify import path_to, random_tree

CPU = torch.device("cpu")


def decoded_logits(model, prefix: list[int], path: list[int]) -> list[torch.Tensor]:
    """Logits after prefix[-1] and after each token of `path`, each from a one-row forward (batch-invariant)."""
    target = Target(model, CPU, invariant=True)
    target.prefill(prefix[:-1])
    out, root = [], prefix[-1]
    for token in [*path, None]:
        out.append(target.verify(root, DraftTree.chain([]))[0])
        target.commit([0])
        root = token
    return out


def assert_rows_are_decodes(model, prefix: list[int], chain: list[int], path_of: DraftTree | None = None) -> None:
    """A chain's verify rows (or, with `path_of`, the tree's path `chain` verified again by `verify_path`)
    equal one-token decodes bit for bit."""
    target = Target(model, CPU, invariant=True)
    target.prefill(prefix[:-1])
    if path_of is None:
        logits = target.verify(prefix[-1], DraftTree.chain(chain))
        tokens = chain
    else:
        target.verify(prefix[-1], path_of)
        replayed, logits = target.verify_path(prefix[-1], path_of, chain)
        tokens = replayed.tokens
    for depth, decoded in enumerate(decoded_logits(model, prefix, tokens)):
        diff = (logits[depth].float() - decoded.float()).abs().max().item()
        assert diff == 0, f"row {depth} of {len(logits)}: verify differs from a one-token decode by {diff}"


def assert_tree_rows_are_decodes(model, prefix: list[int], tree: DraftTree, nodes: list[int]) -> None:
    """Each of `nodes`' rows of one verify of `tree` equals the one-token decode of its path, bit for bit."""
    target = Target(model, CPU, invariant=True)
    assert target.shared.exact_trees
    target.prefill(prefix[:-1])
    logits = target.verify(prefix[-1], tree)
    for node in nodes:
        path = [tree.tokens[i - 1] for i in path_to(tree, node)[1:]]
        decoded = decoded_logits(model, prefix, path)[-1]
        diff = (logits[node].float() - decoded.float()).abs().max().item()
        assert diff == 0, f"node {node} (depth {len(path)}) of {len(tree)}: verify differs from its decode by {diff}"


@pytest.fixture(params=["row kernel", "pytorch"])
def attention(request, monkeypatch) -> str:
    """Both attention forms a batch-invariant CPU target has: the row kernel (`core.row_attention`) and, where it
    is not built, `core.attention.exact_attention` (SPECBENCH_ROW_ATTENTION=0 stands in for a missing compiler)."""
    if request.param == "pytorch":
        monkeypatch.setenv("SPECBENCH_ROW_ATTENTION", "0")
    return request.param


def assert_attention_form(model, attention: str) -> None:
    assert Target(model, CPU, invariant=True).shared.attention == attention


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_bf16_tree_rows_equal_one_token_decodes(arch, attention):
    """Every node of random trees (siblings, deep paths, a span past 512): no second verify needed. (At these
    shapes the kernels happen to round alike wherever a key sits; the embedded test below is the one a tree
    laid out at its own slots fails.)"""
    model = tiny_model(arch).to(torch.bfloat16)
    assert_attention_form(model, attention)
    for length, size in ((30, 12), (45, 40), (530, 24)):
        tree = random_tree(random.Random(length), size, 96)
        assert_tree_rows_are_decodes(model, random_prompt(length, seed=length), tree, list(range(1, size + 1)))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_bf16_chain_rows_equal_one_token_decodes(arch, attention):
    model = tiny_model(arch).to(torch.bfloat16)
    assert_attention_form(model, attention)
    for length, rows in ((30, 8), (45, 40), (530, 20)):  # a short chain, > 32 rows, a span past 512
        assert_rows_are_decodes(model, random_prompt(length, seed=length), random_prompt(rows, seed=rows))


def test_float32_kernels_leave_the_batch_invariant_target_on_the_reference_path(monkeypatch):
    """A plain float32 target gets the row kernel and packed GEMMs, but not a batch-invariant one (bit-exact verify
    rows are established in half precision only): it keeps the reference path, and `--batch-invariant auto` stays
    off in float32. SPECBENCH_FP32_KERNELS=0 puts the plain target on the reference path too."""
    if kernel() is None:
        pytest.skip("the C++ kernels do not build here")
    model = tiny_model("llama")
    assert Target(model, CPU).shared.attention == "row kernel"
    assert Target(model, CPU).shared.layers == "one call"
    assert_attention_form(model, "pytorch")
    assert Target(model, CPU, invariant=True).shared.layers == "pytorch"
    assert not resolve_invariant("auto", False, CPU, torch.float32)
    monkeypatch.setenv("SPECBENCH_FP32_KERNELS", "0")
    assert Target(model, CPU).shared.attention == "pytorch"
    assert Target(model, CPU).shared.layers == "pytorch"


@pytest.mark.slow
@needs_embedded
def test_embedded_bf16_chain_rows_and_tree_paths_equal_one_token_decodes(embedded):
    """The real shapes (576 hidden, 49152-token head, 9 query / 3 kv heads), where the CPU kernels take other
    paths for more rows and longer spans: a chain's rows, a tree's path verified again as a chain
    (`verify_path`, what a float32 or CUDA target does), and every row of a tree."""
    bf16 = embedded.model.to(torch.bfloat16)
    try:
        prompt = embedded.encode_chat([{"role": "user", "content": "Explain why the sky is blue, in detail."}])
        assert_rows_are_decodes(bf16, prompt, random_prompt(40, vocab=4000, seed=2))
        tree = random_tree(random.Random(0), 40, 4000)
        deepest = max(range(1, len(tree) + 1), key=lambda node: len(path_to(tree, node)))
        assert_rows_are_decodes(bf16, prompt, path_to(tree, deepest), path_of=tree)
        # every node: at their tree slots 8 of these 40 rows once differed from their decodes
        assert_tree_rows_are_decodes(bf16, prompt, tree, list(range(1, len(tree) + 1)))
    finally:
        embedded.model.to(torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("chain", [False, True])
def test_bf16_methods_equal_the_bf16_baseline(arch, chain):
    """A drafter that accepts often (trees with non-prefix accepted paths, or chains): the output equals the
    bf16 baseline token for token, without any classification of ties."""
    model = tiny_model(arch).to(torch.bfloat16)
    for seed in range(3):
        prompt = random_prompt(40, seed=seed + 10)
        method = OracleTree(baseline_output(model, prompt, 120, invariant=True), 96, seed=seed, chain=chain)
        assert_lossless(model, method, prompt, max_new=120, min_accepted=20, target=Target(model, CPU, invariant=True))


@pytest.mark.slow
@needs_embedded
def test_embedded_bf16_runs_equal_the_bf16_baseline_turn_by_turn(tmp_path):
    """bf16 CPU runs with `--batch-invariant on`: DFlash's block and ConFu's tree (an EAGLE-3 tree with side rows
    over reserved cache entries), on a multi-turn selection, give the baseline's ids in every turn, and the greedy
    replay (whose reference is this target) finds no token off. CI time: EAGLE-3 alone adds nothing ConFu lacks,
    and the tree has 16 nodes, not the paper's 60 (on a CPU without bf16 instructions bf16 is emulated, and every row
    of an exact verify is a one-token decode)."""
    outputs = {}
    methods = ("baseline", "dflash", "confu")
    tree = tree_opts(16, 4, 4, "confu")
    result = CliRunner().invoke(app, ["run", "--method", ",".join(methods), *tree, "--dtype", "bfloat16", "--limit",
                                      "2", "--max-new-tokens", "32", "--warmup", "0", "--batch-invariant", "on",
                                      "--out", str(tmp_path)])  # one list: the target loads once (CI time)
    assert result.exit_code == 0, result.output
    for method in methods:
        prompts = read_table(tmp_path / method, "prompts").sort_values(["prompt_id", "turn"])
        outputs[method] = [list(ids) for ids in prompts.output_ids]
        assert (prompts.replay_off == 0).all() and (prompts.replay_checked == prompts.new_tokens).all()
        info = json.loads((tmp_path / method / "run.json").read_text())
        assert info["settings"]["batch_invariant"] is True and info["attention"] == "row kernel"
        # the one-call layers run where oneDNN packs bf16 and the start-up probes keep every row in one stacked call
        one_call = can_pack(CPU, torch.bfloat16) and info["stacked"] and info["rows"] == "one call"
        assert info["layers"] == ("one call" if one_call else "pytorch"), info
    assert len(outputs["baseline"]) >= 3  # a multi-turn prompt is in the selection
    for method in ("dflash", "confu"):
        assert outputs[method] == outputs["baseline"], f"{method} leaves the bf16 baseline"


def test_auto_is_exact_where_exactness_costs_nothing():
    """`auto` times the batch-invariant target in half precision on a CPU where the row kernel builds, and the plain
    one elsewhere (as a serving engine runs it; the replay checks exactness apart)."""
    assert resolve_invariant("auto", False, CPU, torch.bfloat16) == (kernel() is not None)  # exact at no cost
    assert not resolve_invariant("auto", True, CPU, torch.bfloat16)
    assert not resolve_invariant("auto", False, CPU, torch.float32)
    assert not resolve_invariant("auto", False, torch.device("cuda"), torch.bfloat16)
    assert resolve_invariant("on", False, CPU, torch.float32)
    assert not resolve_invariant("off", False, CPU, torch.bfloat16)
    with pytest.raises(UsageError, match="drop --compile"):
        resolve_invariant("on", True, CPU, torch.bfloat16)


def test_bad_settings_exit_2_before_a_model_loads(tmp_path):
    for args, says in ((["--batch-invariant", "sometimes"], "--batch-invariant"),
                       (["--batch-invariant", "on", "--compile"], "drop --compile")):
        result = CliRunner().invoke(app, ["run", "--limit", "1", "--out", str(tmp_path / "r"), *args])
        assert result.exit_code == 2 and says in result.output, result.output
