"""Batch > 1 in our engine (core/engine.py): every sequence's output is its batch-1 output, whatever its
neighbours draft, however long they run, and wherever in the batch it sits."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from specbench_cli.core.engine import Turn, decode, decode_turn
from specbench_cli.core.method import DecodeState, Method
from specbench_cli.core.target import Target, TargetModel
from specbench_cli.core.tree import DraftTree
from specbench_cli.core.turn import DecodeSettings, TurnResult
from tests.conftest import THREADS, needs_embedded
from tests.helpers import OracleTree, random_prompt, run_method
from tests.test_lossless import make


class BatchOracle(OracleTree):
    """OracleTree for many prompts: each sequence drafts from its own prompt's reference output."""


    def __init__(self, references: dict[tuple[int, ...], list[int]], vocab: int, chain: bool = False) -> None:
        super().__init__([], vocab, seed=5, chain=chain)
        self.references = references

    def propose_one(self, state: DecodeState) -> DraftTree:
        self.reference = self.references[tuple(state.tokens[:state.prompt_len])]
        return super().propose_one(state)


def run_batch(model, method: Method, prompts: list[list[int]], size: int, max_new: int,
              stops: frozenset[int] = frozenset(), temperature: float = 0.0, invariant: bool = False,
              seed: int = 0, compile: str | None = None) -> tuple[list[TurnResult], object]:
    """Decode single-turn prompts `size` at a time, each with its own generator; results in prompt order and
    the batch's stats (with `compile`: its `late_compiles` too)."""
    batch = TargetModel(model, torch.device("cpu"), compile, (1, 4, 16, 64), invariant, slots=size)
    if compile:
        batch.plan(256)
        batch.warm_up()
    waiting = collections.deque(range(len(prompts)))
    current: dict[int, int] = {}
    results: dict[int, TurnResult] = {}

    def feed(lane: int, result: TurnResult | None) -> Turn | None:
        if result is not None:
            results[current.pop(lane)] = result
        if not waiting:
            return None
        current[lane] = i = waiting.popleft()
        return Turn(prompts[i], torch.Generator().manual_seed(seed + i))

    stats = decode(batch, method, size, DecodeSettings(max_new, temperature, stops), feed)
    if compile:
        stats.late_compiles = batch.late_compiles
    return [results[i] for i in range(len(prompts))], stats


def prompts_of(n: int, vocab: int = 96) -> list[list[int]]:
    """Prompts of very different lengths (8 to 90 tokens)."""
    return [random_prompt(8 + (i * 37) % 83, vocab, seed=100 + i) for i in range(n)]


def batch_one(model, prompts, max_new, stops=frozenset(), invariant=False) -> list[list[int]]:
    target = Target(model, torch.device("cpu"), invariant=invariant)
    return [run_method(model, make("baseline"), p, max_new, stops, target=target).output_ids for p in prompts]


@pytest.fixture(scope="module")
def references(tiny):
    """Ten prompts of different lengths, their batch-1 greedy outputs, and a stop token that ends some of them
    early (so sequences leave the batch at different rounds)."""
    prompts = prompts_of(10)
    outputs = batch_one(tiny, prompts, 60)
    counts = collections.Counter(t for out in outputs for t in out[5:40])
    stop = counts.most_common(1)[0][0]
    stopped = batch_one(tiny, prompts, 60, frozenset({stop}))
    assert 2 <= sum(len(o) < 60 for o in stopped) <= 9, "the stop token should end some outputs early, not all"
    return prompts, stop, stopped


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 3, 8])
@pytest.mark.parametrize("name", ["baseline", "oracle-tree", "oracle-chain", "suffix", "pld"])
def test_every_sequence_equals_its_batch_one_output(tiny, references, size, name):
    prompts, stop, expected = references
    if name.startswith("oracle"):
        refs = {tuple(p): out for p, out in zip(prompts, expected)}
        method = BatchOracle(refs, 96, chain=name == "oracle-chain")
    else:
        method = make(name)
    results, stats = run_batch(tiny, method, prompts, size, 60, frozenset({stop}))
    assert [r.output_ids for r in results] == expected
    rounds = [info for r in results for info in r.rounds]
    assert max(info.batch for info in rounds) == size and min(info.batch for info in rounds) < size
    if name != "baseline":
        assert sum(info.accepted for info in rounds) >= 40, "drafts were barely accepted"
    if name == "oracle-tree":
        assert any(info.tree_size > info.draft_depth for info in rounds), "no round verified a real tree"
    assert stats.tokens == sum(len(r.output_ids) for r in results)
    # every round's rows: one per busy slot, slots 0..n-1
    by_round = collections.defaultdict(list)
    for info in rounds:
        by_round[info.batch_round].append(info)
    assert all(sorted(i.slot for i in infos) == list(range(infos[0].batch)) for infos in by_round.values())
    assert len(by_round) == stats.rounds


@pytest.mark.slow
@pytest.mark.parametrize("tiny, size, name", [("llama", 2, "oracle-tree"), ("qwen3", 3, "oracle-tree"),
                                               ("llama", 8, "oracle-chain"), ("qwen3", 3, "suffix")], indirect=["tiny"])
def test_compiled_batch_equals_batch_one(tiny, references, size, name):
    """The compiled batched verify ([B, bucket] graphs, idle slots as dummies, cache rows written by the host)
    gives every sequence its batch-1 output, sequences leaving at different rounds; aot_eager traces the graph
    inductor and CUDA graphs get. (Each case on one architecture: every compiled batch size traces its own graphs,
    and the eager batch tests above cover both.)"""
    prompts, stop, expected = references
    method = (make(name) if name == "suffix" else
              BatchOracle({tuple(p): out for p, out in zip(prompts, expected)}, 96, chain=name == "oracle-chain"))
    results, stats = run_batch(tiny, method, prompts, size, 60, frozenset({stop}), compile="aot_eager")
    assert [r.output_ids for r in results] == expected
    assert sum(info.accepted for r in results for info in r.rounds) >= 40
    assert not stats.late_compiles


def test_compiled_batch_verify_computes_the_eager_one(tiny):
    """Logits and captured layers of a compiled batched verify (trees of different sizes, an idle slot) are
    those of the eager batched verify."""
    import random

    from specbench_cli.commands.tune.pricing import random_tree

    results = []
    for compile in (None, "aot_eager"):
        batch = TargetModel(tiny, torch.device("cpu"), compile, (16,), slots=3)  # one graph: both trees pad to 16
        batch.plan(256)
        batch.warm_up()
        for b, target in enumerate(batch.slots):
            target.capture([0, 1])
            target.prefill(random_prompt(20 + 7 * b, seed=b))
        trees = [(5, random_tree(9, 96, random.Random(1))), (7, DraftTree.chain([3, 4]))]  # slot 2 idle
        logits = batch.verify([(t, root, tree, None) for t, (root, tree) in zip(batch.slots, trees)])
        results.append((logits, [dict(t.captured) for t in batch.slots[:2]]))
    (eager, eager_captured), (compiled, compiled_captured) = results
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for a, b in zip(eager_captured, compiled_captured):
        assert a.keys() == b.keys() == {0, 1}
        for layer in a:
            torch.testing.assert_close(a[layer], b[layer], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_bfloat16_batch_invariant_is_bitwise_batch_one(tiny, references):
    """With the batch-invariant target every row is computed as a one-token decode computes it, so in bfloat16 too
    each sequence of a batch emits exactly its batch-1 greedy output (trees included: their paths are verified
    again as chains, all sequences in one forward)."""
    prompts, stop, _ = references
    model = tiny.to(torch.bfloat16)
    try:
        expected = batch_one(model, prompts, 40, invariant=True)
        refs = {tuple(p): out for p, out in zip(prompts, expected)}
        results, _ = run_batch(model, BatchOracle(refs, 96), prompts, 4, 40, invariant=True)
        assert [r.output_ids for r in results] == expected
        plain, _ = run_batch(model, make("baseline"), prompts, 4, 40, invariant=True)
        assert [r.output_ids for r in plain] == expected
    finally:
        tiny.to(torch.float32)


NETWORK_DRAFTERS = {"eagle3-tree": ("eagle3", dict(depth=4, top_k=4, total_token=16)),
                    "eagle3-chain": ("eagle3", dict(depth=5, top_k=1, total_token=6)),
                    "dflash": ("dflash", dict(block_size=6)),
                    "dart": ("dart", dict(total=12, beam_width=4, top_k=4))}


@pytest.mark.slow
@pytest.mark.parametrize("case, arch", [("eagle3-tree", "llama"), ("eagle3-chain", "qwen3"), ("dflash", "qwen3"),
                                        ("dart", "llama")])
def test_network_drafters_draft_a_batch_in_one_forward_and_stay_lossless(distilled, arch, case):
    """Batched drafting (`propose`: one draft forward per step for all sequences) with distilled drafters:
    every sequence equals its batch-1 output, and drafts what it drafts at batch 1 (the same accepted lengths
    round by round). Both architectures, each drafter on one (tests/test_model_drafters.py runs each on both)."""
    from tests.drafter_fixtures import make_method

    name, opts = NETWORK_DRAFTERS[case]
    target, corpus, folder = distilled(name, arch)
    prompts = [seq[:12 + 7 * i] for i, seq in enumerate(corpus)] + [seq[:30] for seq in corpus[:2]]
    alone = [run_method(target, make_method(name, target, folder, **opts), p, 50) for p in prompts]
    method = make_method(name, target, folder, **opts)
    calls = []
    network = method.draft.block if name == "dflash" else method.draft.step
    spy = lambda h, *a, **k: calls.append(h.shape[0] if h.dim() == (2 if name == "dflash" else 3) else 1) or network(h, *a, **k)  # noqa: E731
    setattr(method.draft, "block" if name == "dflash" else "step", spy)
    results, _ = run_batch(target, method, prompts, 3, 50)
    assert [r.output_ids for r in results] == [r.output_ids for r in alone]
    assert [[i.accepted for i in r.rounds] for r in results] == [[i.accepted for i in r.rounds] for r in alone]
    assert sum(i.accepted for r in results for i in r.rounds) >= 40
    assert max(calls) == 3, "the draft never ran one forward over the whole batch"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["confu", "sps", "sps-naive", "flashhead"])
def test_every_hook_batches_and_equals_batch_one(distilled, tmp_path, monkeypatch, case):
    """The hooks beyond drafting at batch 3: ConFu (its soft prompt reserved in every slot, its contemplate tokens
    side rows of the one verify forward, each sequence's future token from its own side rows), SpS deferred and
    naive (`deferred=false`: an extra target forward per sequence, its root then cached in the verify) and
    FlashHead: every sequence equals its batch-1 output, accepted lengths and target forwards round by round."""
    from specbench_methods.flashhead import FlashHead
    from specbench_methods.sps import SpS
    from tests.drafter_fixtures import loaded, make_method

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    if case == "confu":
        target, corpus, folder = distilled("confu", "llama")
        make_one = lambda: make_method("confu", target, folder, depth=4, top_k=4, total_token=16)  # noqa: E731
    else:
        target, corpus = distilled.target("llama")
        target.save_pretrained(tmp_path / "copy")  # a copy of the target as the draft model accepts every draft
        cls = FlashHead if case == "flashhead" else SpS
        opts = dict(cluster_size=8, n_probes=4) if case == "flashhead" else dict(deferred=case == "sps")
        make_one = lambda: cls(cls.Options(k=4, **opts), loaded(target), {"sps": str(tmp_path / "copy")})  # noqa: E731
    prompts = [seq[:10 + 9 * i] for i, seq in enumerate(corpus)] + [seq[:30] for seq in corpus[:2]]
    alone = [run_method(target, make_one(), p, 40) for p in prompts]
    results, _ = run_batch(target, make_one(), prompts, 3, 40)
    assert [r.output_ids for r in results] == [r.output_ids for r in alone]
    for field in ("accepted", "target_forwards"):
        assert [[getattr(i, field) for i in r.rounds] for r in results] == [[getattr(i, field) for i in r.rounds]
                                                                             for r in alone]
    assert sum(i.accepted for r in results for i in r.rounds) >= 40
    assert max(i.batch for r in results for i in r.rounds) == 3
    if case == "sps-naive":
        assert all(i.target_forwards == 2 for r in results for i in r.rounds)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def noisy_draft(request, tmp_path_factory):
    """A tiny target, sharpened as the distilled ones are (tests/drafter_fixtures.py), and a noisy copy of it as the
    SpS draft model: it drafts what the target would in part only, so the sequences of a batch keep different
    numbers of drafts round by round and their rows of the batched draft cache are padded differently."""
    import copy

    from tests.conftest import tiny_model
    from tests.drafter_fixtures import SHARPEN

    target = tiny_model(request.param)
    with torch.no_grad():
        target.lm_head.weight.mul_(SHARPEN)
    noisy = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.3 * p.std())
    folder = tmp_path_factory.mktemp("noisy-draft") / request.param
    noisy.save_pretrained(folder)
    return target, folder


def _sps(name: str, target, folder):
    from specbench_methods.flashhead import FlashHead
    from specbench_methods.sps import SpS
    from tests.drafter_fixtures import loaded

    cls = FlashHead if name == "flashhead" else SpS
    opts = dict(cluster_size=8, n_probes=4) if name == "flashhead" else dict(deferred=name == "sps")
    return cls(cls.Options(k=4, **opts), loaded(target), {"sps": str(folder)})


@pytest.mark.parametrize("name, temperature", [
    ("sps", 0.0),
    pytest.param("sps", 1.5, marks=pytest.mark.slow),
    pytest.param("sps-naive", 0.0, marks=pytest.mark.slow),
    pytest.param("flashhead", 0.0, marks=pytest.mark.slow),
    pytest.param("flashhead", 1.5, marks=pytest.mark.slow),
])
def test_sps_and_flashhead_draft_a_batch_in_one_forward_per_step(noisy_draft, tmp_path, monkeypatch, name,
                                                                 temperature):
    """SpS and FlashHead at batch 3 with a draft that is accepted in part: each round runs the draft model k times
    for the whole batch (one forward over every sequence's unseen tokens, then one per draft step), never once per
    sequence, and every sequence drafts, samples and emits what it does at batch 1 (the same accepted lengths round
    by round; at temperature > 0 with the same per-sequence generators)."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    target, folder = noisy_draft
    prompts = [random_prompt(8 + 13 * i, seed=50 + i) for i in range(5)]
    settings = DecodeSettings(40, temperature, frozenset())
    alone = [decode_turn(Target(target, torch.device("cpu")), _sps(name, target, folder), p, settings,
                         torch.Generator().manual_seed(7 + i)) for i, p in enumerate(prompts)]
    method = _sps(name, target, folder)
    rows: list[int] = []
    method.draft.base_model.register_forward_hook(lambda m, args, kwargs, out: rows.append(kwargs["input_ids"].shape[0]),
                                                  with_kwargs=True)
    results, stats = run_batch(target, method, prompts, 3, 40, temperature=temperature, seed=7)
    assert [r.output_ids for r in results] == [r.output_ids for r in alone]
    assert [[i.accepted for i in r.rounds] for r in results] == [[i.accepted for i in r.rounds] for r in alone]
    assert len(rows) == method.options.k * stats.rounds, "the draft model ran once per sequence, not once per step"
    assert max(rows) == 3 and max(i.batch for r in results for i in r.rounds) == 3
    accepted = [i.accepted for r in results for i in r.rounds]
    assert sum(accepted) >= 40 and len(set(accepted)) >= 3  # drafts accepted in part, rows keeping different counts
    if temperature > 0:
        greedy = [run_method(target, make("baseline"), p, 40).output_ids for p in prompts]
        assert sum(r.output_ids != g for r, g in zip(alone, greedy)) >= 2, "nothing was sampled"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sps", "flashhead"])
def test_sps_and_flashhead_batch_over_a_compiled_target(noisy_draft, tmp_path, monkeypatch, name):
    """The batched draft over the compiled batched verify: every sequence equals its eager batch-1 output, with the
    same accepted lengths, and nothing compiles late."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    target, folder = noisy_draft
    prompts = [random_prompt(8 + 13 * i, seed=50 + i) for i in range(5)]
    alone = [run_method(target, _sps(name, target, folder), p, 40) for p in prompts]
    results, stats = run_batch(target, _sps(name, target, folder), prompts, 3, 40, compile="aot_eager")
    assert [r.output_ids for r in results] == [r.output_ids for r in alone]
    assert [[i.accepted for i in r.rounds] for r in results] == [[i.accepted for i in r.rounds] for r in alone]
    assert max(i.batch for r in results for i in r.rounds) == 3 and not stats.late_compiles


@pytest.mark.parametrize("case, opts", [("eagle3-tree", {}), ("dflash", {"sampling": "sample"}), ("dart", {})])
def test_sampling_in_a_batch_draws_what_batch_one_draws(distilled, case, opts):
    """Temperature 0.8: each sequence has its own generator (seeded per turn, as the runner seeds it) and a
    drafter that drafts what it drafts alone, so a batch must sample exactly the tokens batch 1 samples; since
    batch-1 sampling reproduces the target's distribution (tests/test_sampling.py), so does every sequence of a
    batch. DFlash with sampled drafts carries draft distributions into the acceptance."""
    from tests.drafter_fixtures import make_method

    name, shape = NETWORK_DRAFTERS[case]
    target, corpus, folder = distilled(name, "llama")
    prompts = [seq[:10 + 9 * i] for i, seq in enumerate(corpus)]
    settings = DecodeSettings(40, 0.8, frozenset())
    alone = [decode_turn(Target(target, torch.device("cpu")), make_method(name, target, folder, **shape, **opts), p,
                         settings, torch.Generator().manual_seed(7 + i)) for i, p in enumerate(prompts)]
    batched, _ = run_batch(target, make_method(name, target, folder, **shape, **opts), prompts, 3, 40,
                           temperature=0.8, seed=7)
    assert [r.output_ids for r in batched] == [r.output_ids for r in alone]
    greedy = [run_method(target, make("baseline"), p, 40).output_ids for p in prompts]
    assert sum(r.output_ids != g for r, g in zip(alone, greedy)) >= 2, "nothing was sampled"
    assert sum(i.accepted for r in batched for i in r.rounds) >= 10


# ---------------------------------------------------------------------------------------------- the command
def _cli(*args: str):
    from typer.testing import CliRunner

    from specbench_cli.cli import app

    return CliRunner().invoke(app, ["run", "--model", "smollm2-135m", "--threads", THREADS, "--dtype", "float32", *args])


@pytest.mark.slow
@needs_embedded
def test_batched_runs_equal_batch_one_turn_by_turn_and_resume(tmp_path):
    """`run --batch-size` on the embedded model: multi-turn prompts (a conversation keeps its slot), suffix and the
    committed EAGLE-3 at batch 3, each prompt's turns equal to the batch-1 baseline's; rounds rows carry the
    batch; run.json the throughput; a batch run killed after its first prompt resumes to the same records."""
    from specbench_cli.records import read_table

    # no warm-up and no replay: neither is asserted here (each has its own tests), and each cost a fifth of the time
    args = ["--dataset", "spec-bench", "--category", "writing", "--category", "summarization", "--limit", "4",
            "--max-new-tokens", "24", "--warmup", "0", "--no-replay"]
    small = ["--opt", "total_token=8", "--opt", "depth=3", "--opt", "top_k=3"]
    for method, size, extra in (("baseline", "1", []), ("suffix", "3", []), ("eagle3", "2", small)):
        result = _cli("--method", method, *args, *extra, "--batch-size", size, "--out", str(tmp_path / method))
        assert result.exit_code == 0, result.output
    base = read_table(tmp_path / "baseline", "prompts").sort_values(["prompt_id", "turn"])
    assert base.turn.max() == 1 and len(base) >= 5
    for method, size in (("suffix", 3), ("eagle3", 2)):
        mine = read_table(tmp_path / method, "prompts").sort_values(["prompt_id", "turn"])
        assert [list(x) for x in mine.output_ids] == [list(x) for x in base.output_ids], method
        rounds = read_table(tmp_path / method, "rounds")
        assert rounds.batch_size.max() == size and (rounds.batch_round >= 0).all(), method
        assert rounds.accepted.sum() > 0, method
        info = json.loads((tmp_path / method / "run.json").read_text())
        assert info["settings"]["batch_size"] == size and info["throughput"]["output_tokens"] == mine.new_tokens.sum()

    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "specbench_cli.cli", "run", "--model", "smollm2-135m", "--threads", THREADS, "--dtype",
           "float32", "--method", "suffix", *args, "--batch-size", "3", "--out", str(killed)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.time() + 600
    while not list((killed / "prompts.parquet").glob("part-*.parquet")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the run to be killed ended by itself (exit {proc.returncode})"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 1 <= read_table(killed, "prompts")["index"].nunique() < 4
    assert _cli("--method", "suffix", *args, "--batch-size", "3", "--out", str(killed), "--resume").exit_code == 0
    again = read_table(killed, "prompts").sort_values(["prompt_id", "turn"])
    assert [list(x) for x in again.output_ids] == [list(x) for x in base.output_ids]


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "expected distinct positive whole numbers"),
    (["--batch-size", "two"], "expected distinct positive whole numbers"),
    (["--batch-size", "2,2"], "expected distinct positive whole numbers"),
    (["--batch-size", "9", "--limit", "4"], "more than the 4 prompt(s) selected"),
    (["--batch-size", "2", "--method", "hf-generate"], "hf-generate runs its own loop, one sequence at a time"),
    (["--batch-size", "2", "--engine", "vllm"], "use --concurrency"),
    (["--batch-size", "2", "--device", "split"], "runs on one device"),
    (["--batch-size", "1,2", "--engine", "vllm", "--concurrency", "1,2"], "not both at once"),
])
def test_bad_batch_input_is_one_line_before_anything_loads(tmp_path, args, message, monkeypatch):
    from specbench_cli import planning

    monkeypatch.setattr(planning, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    method = [] if "--method" in args else ["--method", "suffix"]
    result = _cli(*method, "--dataset", "spec-bench", "--limit", "4", *args, "--out", str(tmp_path / "x"))
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_a_batch_round_counts_once_in_the_phase_split():
    """Rows of one batch round share its phase times: the phase table must not count them once per sequence."""
    import pandas as pd

    from specbench_cli.analysis.phases import split

    row = dict(route_ms=0.0, catchup_ms=0.0, extra_forward_ms=0.0, draft_ms=2.0, draft_head_ms=0.0, verify_ms=10.0,
               accept_ms=1.0, commit_ms=1.0, run="r")
    rounds = pd.DataFrame([{**row, "batch_round": 0, "wall_ms": 20.0}] * 4 + [{**row, "batch_round": 1, "wall_ms": 40.0}])
    parts = split(rounds)
    assert len(parts) == 2 and parts["round"].mean() == 30.0
    assert len(split(rounds.assign(batch_round=-1))) == 5  # batch 1: every row is a round


@pytest.mark.slow
@pytest.mark.parametrize("name", ["whiflash-entropy", "hvd-freq"])
def test_routed_methods_route_each_sequence_of_a_batch(distilled, name):
    """WhiFlash and HVD at batch 3: every sequence routed on its own (rounds of one forward mixing proposers),
    each proposer drafting at once for the sequences sent to it, lazy catch-up per sequence; every sequence equal
    to its batch-1 output. WhiFlash's entropy router sees the same target logits as at batch 1, so it routes each
    sequence as batch 1 does (HVD's suffix lookups also see the other sequences' outputs, so its routes may differ)."""
    import statistics

    from specbench_methods.dflash import DFlash
    from specbench_methods.eagle3 import Eagle3
    from specbench_cli.registry import method_class
    from tests.drafter_fixtures import loaded

    target, corpus, eagle3 = distilled("eagle3", "llama")
    drafters = {"eagle3": eagle3, "dflash": distilled("dflash", "llama")[2]}
    small = {"eagle3": Eagle3.Options(depth=4, top_k=4, total_token=16), "dflash": DFlash.Options(block_size=4)}
    if name == "hvd-freq":
        small.pop("dflash")
    prompts = [seq[:10 + 9 * i] for i, seq in enumerate(corpus)] + [seq[:30] for seq in corpus[:2]]

    def method(threshold):
        cls = method_class(name)
        return cls(cls.Options(threshold=threshold, **small), loaded(target), {k: str(v) for k, v in drafters.items()})

    signal = "entropy" if name == "whiflash-entropy" else "router_score"
    probe = [run_method(target, method(-1.0 if signal == "entropy" else 1e9), p, 50) for p in prompts[:2]]
    threshold = statistics.median(r.extras[signal] for res in probe for r in res.rounds if r.extras[signal] > 0)
    alone = [run_method(target, method(threshold), p, 50) for p in prompts]
    results, _ = run_batch(target, method(threshold), prompts, 3, 50)
    assert [r.output_ids for r in results] == [r.output_ids for r in alone]
    rounds = [i for r in results for i in r.rounds]
    assert {i.proposer for i in rounds} == ({"eagle3", "dflash"} if signal == "entropy" else {"eagle3", "suffix"})
    mixed = collections.defaultdict(set)
    for i in rounds:
        mixed[i.batch_round].add(i.proposer)
    assert any(len(used) > 1 for used in mixed.values()), "no batch round mixed proposers"
    assert all("backlog" in i.extras for i in rounds)
    if signal == "entropy":
        assert [[i.proposer for i in r.rounds] for r in results] == [[i.proposer for i in r.rounds] for r in alone]
