"""Paired runs (`run --method a,b,c --repeat N`, issue 50): the interleaving driver on stand-in jobs (the order
rotated prompt by prompt, passes marked and started afresh, resume), then a real list on the embedded model."""

from __future__ import annotations

import contextlib
import json

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from specbench_cli.cli import app
from specbench_cli.datasets import Prompt
from specbench_cli.records import RUN_TABLES, PromptRecord, read_table, run_parts
from specbench_cli.run_folder import RunFolder, Start, record_interleaved
from tests.conftest import THREADS, needs_embedded


class Stand:
    """A job that decodes nothing: it logs what the driver asks of it and writes one row per prompt."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log
        self.decoded: list = []

    def begin(self) -> Start:
        return Start({"method": self.name}, {"started": "now", "environment": {}})

    def prepare(self) -> dict:
        return {}

    def starting(self):
        return contextlib.nullcontext()

    def running(self, info, save):
        return contextlib.nullcontext()

    def warm_up(self, prompt: Prompt) -> None:
        self.log.append((self.name, "warm", prompt.id))

    def absorb(self, ids: list[int]) -> None:
        self.log.append((self.name, "absorb", tuple(ids)))

    def new_pass(self) -> None:
        self.log.append((self.name, "new pass"))

    def decode(self, index: int, prompt: Prompt, text: str = "") -> dict:
        if not text:
            self.log.append((self.name, "decode", index))
            self.decoded.append((index, prompt))
        row = PromptRecord("r", self.name, "m", "d", "c", "s", prompt.id, 0, index=index, prompt_tokens=1,
                           new_tokens=2, decode_tokens=1, rounds=1, ttft_ms=1.0, decode_ms=1.0, tokens_per_s=1e3,
                           tau=1.0, stop_reason="max_new_tokens", clock="perf_counter_ns", output_hash="h",
                           output_text=text, output_ids=[index, index])
        return run_parts([], [row])

    def replayed(self) -> list[tuple[int, dict]]:
        """Every prompt decoded this session, written again once the block has ended (as a vLLM run's replay)."""
        done, self.decoded = self.decoded, []
        return [(index, self.decode(index, prompt, text="replayed")) for index, prompt in done]

    def stats(self) -> str:
        return ""

    def facts(self, info) -> dict:
        return {}


PROMPTS = [Prompt(f"p{i}", "d", "c", "s", ["hi"]) for i in range(3)]
WARM = [Prompt("w", "d", "c", "s", ["hi"])]


def interleave(tmp_path, names, passes, resume=False, log=None):
    log = [] if log is None else log
    members = [(RunFolder(tmp_path / n, RUN_TABLES), Stand(n, log), resume) for n in names]
    for folder, _, _ in members:
        folder.path.mkdir(exist_ok=True)
    record_interleaved(members, PROMPTS, WARM, passes, Console(quiet=True), "test", {"id": "x"})
    return log


def test_every_prompt_by_every_member_in_a_rotated_order(tmp_path):
    log = interleave(tmp_path, ["a", "b", "c"], passes=2)
    decodes = [(who, i) for who, what, *i in log if what == "decode"]
    order = [[who for who, i in decodes if i == [index]] for index in range(6)]
    assert order == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]] * 2
    # each pass starts afresh: new state and the warm-up again, before any of the pass's decodes
    for who in "abc":
        mine = [entry[1:] for entry in log if entry[0] == who]
        assert mine[:1] == [("warm", "w")] and mine[4:6] == [("new pass",), ("warm", "w")]
    prompts = read_table(tmp_path / "b", "prompts").sort_values("index")
    assert list(prompts.repeat) == [0, 0, 0, 1, 1, 1] and list(prompts.prompt_id) == ["p0", "p1", "p2"] * 2
    assert (prompts.output_text == "replayed").all()  # rows written again after the list, each in its own pass
    info = json.loads((tmp_path / "c" / "run.json").read_text())
    assert info["pairing"] == {"id": "x", "member": "c"} and info["status"] == "complete"


def test_a_resumed_list_decodes_only_what_each_member_lacks(tmp_path):
    interleave(tmp_path, ["a", "b"], passes=2)
    for table in RUN_TABLES:  # b was killed during pass 1, after its answer to p0 (part 3)
        for index in (4, 5):
            (tmp_path / "b" / f"{table}.parquet" / f"part-{index:05d}.parquet").unlink(missing_ok=True)
    log = interleave(tmp_path, ["a", "b"], passes=2, resume=True)
    assert [(who, i) for who, what, *i in log if what == "decode"] == [("b", [4]), ("b", [5])]
    # pass 1's state is rebuilt from that pass's finished answers only (p0's, part 3, ids [3, 3])
    mine = [e[1:] for e in log if e[0] == "b" and e[1] in ("absorb", "new pass", "warm")]
    assert mine == [("new pass",), ("warm", "w"), ("absorb", (3, 3))]  # pass 0, finished by both, is skipped


def test_a_resume_without_the_passes_a_run_had_is_refused(tmp_path):
    from specbench_cli.core.errors import UsageError
    from specbench_cli.run_folder import RunInfo

    folder = RunFolder(tmp_path / "r", RUN_TABLES)
    folder.path.mkdir()
    folder.start(RunInfo({"method": "suffix", "repeat": 3}, "now", {}), {"started": "now", "environment": {}})
    with pytest.raises(UsageError, match="different settings \\(repeat\\)"):
        folder.resumed({"method": "suffix"}, {})  # run again without --repeat: the key is missing, not equal
    assert folder.resumed({"method": "suffix", "repeat": 3}, {}).settings["repeat"] == 3


TINY = ["--model", "smollm2-135m", "--threads", THREADS, "--dtype", "float32", "--max-new-tokens", "16", "--limit", "2",
        "--warmup", "0"]


@needs_embedded
@pytest.mark.slow
def test_a_real_list_is_lossless_paired_and_measures_its_noise(embedded, tmp_path):
    out = tmp_path / "pair"
    result = CliRunner().invoke(app, ["run", *TINY, "--method", "baseline,suffix,baseline", "--repeat", "2",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    runs = {name: read_table(out / name, "prompts") for name in ("baseline", "suffix", "baseline-2")}
    ids = lambda frame: {(r.prompt_id, r.turn, r.repeat): list(r.output_ids) for r in frame.itertuples()}  # noqa: E731
    assert ids(runs["suffix"]) == ids(runs["baseline"]) == ids(runs["baseline-2"])
    assert sorted(set(runs["suffix"].repeat)) == [0, 1]
    by_pass = runs["suffix"].sort_values(["prompt_id", "turn"]).groupby("repeat").tau.apply(list)
    assert by_pass[0] == by_pass[1]  # pass 1 starts from an empty suffix cache, as pass 0 did
    pairings = {json.loads((out / n / "run.json").read_text())["pairing"]["id"] for n in runs}
    assert len(pairings) == 1
    table = pd.read_csv(out / "overview.csv").set_index("method")
    assert table.loc["suffix", "speedup 95% CI"].endswith("paired")
    assert table.loc["baseline-2", "speedup"] > 0  # the A/A ratio
    assert "A/A baseline-2/baseline" in (out / "overview.md").read_text()
    from specbench_cli.analysis.report import lossless
    from specbench_cli.analysis.results import load

    check = lossless(load([out])).frame.set_index("method")
    assert check.loc["suffix", "identical"] == 1.0 and check.loc["suffix", "turns compared"] == len(runs["suffix"])

    # Spec-Bench's answer files of the same runs, read as its speed.py reads them (tests/test_exports.py): the
    # method's rate is ours; the baseline's, from re-tokenized texts, ours within the stop tokens the texts drop
    from transformers import AutoTokenizer

    from specbench_cli.analysis import exports
    from specbench_cli.loading import embedded_folder
    from tests.test_exports import answers, speed_py_rate

    files = {p.name.removeprefix("smollm2-135m-").removesuffix("-float32-temperature-0.0.jsonl"): answers(p)
             for p in exports.export(load([out]), "spec-bench", tmp_path / "x")}
    assert len(files["suffix"]) == 2 * 2  # a line per prompt and pass
    assert speed_py_rate(files["suffix"]) == pytest.approx(table.loc["suffix", "tokens/s"])
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_folder()))
    rates = [sum(len(tokenizer(t).input_ids) - 1 for t in a["choices"][0]["turns"]) / sum(a["choices"][0]["wall_time"])
             for a in files["baseline"]]
    assert sum(rates) / len(rates) == pytest.approx(table.loc["baseline", "tokens/s"], rel=0.1)


@pytest.mark.parametrize("engine", ["specbench", "vllm"])
def test_the_second_baseline_of_an_a_a_pair_is_known_by_its_member_name_in_every_engine(tmp_path, engine):
    """The A/A pair's first baseline is the baseline (no speedup of its own), its second the noise; a vLLM pair's
    labels carry the engine as every vLLM run's do."""
    from specbench_cli.analysis.report import overview
    from specbench_cli.analysis.results import load
    from tests.fake_runs import Turn, write_run

    settings = {} if engine == "specbench" else {"engine": "vllm", "concurrency": 1}
    for member, ms in (("baseline", 10.0), ("baseline-2", 11.0)):
        turns = [Turn(f"p{i}", "writing", [0] * 9, ms * (1 + i % 3), depth=0) for i in range(6)]
        write_run(tmp_path / member, "baseline", turns, settings=settings,
                  more={"pairing": {"id": "x", "members": ["baseline", "baseline-2"], "member": member}})
    results = load([tmp_path])
    prefix = "" if engine == "specbench" else "vllm:"
    first, second = sorted(results.groups, key=lambda g: g.second_of_pair)
    assert (first.label, second.label) == (f"{prefix}baseline", f"{prefix}baseline-2")
    assert results.baseline_for(second) is first
    table = overview(results)
    rows = table.frame.set_index("method")
    assert rows.loc[f"{prefix}baseline", "speedup 95% CI"] == "—"
    assert rows.loc[f"{prefix}baseline-2", "speedup"] == pytest.approx(10 / 11)
    assert f"A/A {prefix}baseline-2/{prefix}baseline" in table.note
