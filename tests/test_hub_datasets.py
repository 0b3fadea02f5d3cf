"""The hub datasets' loaders on small local files in each dataset's hub schema (parquet, or json lines for the
file-based livecodebench), written here: never the network."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from specbench_cli.cli import app
from specbench_cli.core.errors import UsageError
from specbench_cli.datasets import load_dataset, load_suite
from specbench_cli.hub_datasets import BOXED, GROUPS, HUB

# One row per dataset in its hub schema (the columns each loader reads, plus some it ignores) and the first
# user turn it must give.
ROWS = {
    "gsm8k": ({"question": "2+2?", "answer": "#### 4"}, "2+2?" + BOXED),
    "math500": ({"problem": "x^2=4", "solution": "", "answer": "2", "subject": "Algebra", "level": 1,
                 "unique_id": "test/algebra/1.json"}, "x^2=4" + BOXED),
    "aime24-h4": ({"id": 60, "problem": "Find n.", "solution": "", "answer": "25", "url": "u", "year": 2024},
                  "Find n." + BOXED),
    "aime25-matharena": ({"problem_idx": 1, "problem": "Find m.", "answer": 70, "problem_type": ["Number Theory"]},
                         "Find m." + BOXED),
    "alpaca": ({"instruction": "Sort these.", "input": "3 1 2", "output": "1 2 3", "text": ""},
               "Sort these.\n\nInput:\n3 1 2"),
    "mt-bench-prompts": ({"prompt": ["Write a poem.", "Shorten it."], "prompt_id": 81, "category": "writing",
                          "reference": []}, "Write a poem."),
    "humaneval": ({"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "", "test": "",
                   "entry_point": "f"}, "Write a solution to the following problem and make sure that it passes the "
                                        "tests:\n```python\ndef f():\n\n```"),
    "mbpp": ({"source_file": "x", "task_id": 602, "prompt": "Write a function.", "code": "", "test_imports": [],
              "test_list": ["assert True"]}, "Write a function."),
    "livecodebench": ({"question_title": "t", "question_content": "Read n.", "platform": "atcoder",
                       "question_id": "abc1", "starter_code": ""}, None),
    "swe-bench": ({"repo": "a/b", "instance_id": "a__b-1", "problem_statement": "It crashes.", "base_commit": "c"},
                  "Problem Statement:\nIt crashes.\nPlease fix the issue described above."),
}


def write(folder: Path, name: str, rows: list[dict]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    if HUB[name].files:  # served as json lines files
        path = folder / "test.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        path = folder / "test.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    return [path]


@pytest.mark.parametrize("name", sorted(HUB))
def test_each_loader_reads_its_hub_schema(tmp_path, name):
    row, first_turn = ROWS[name]
    prompts = load_suite(name, {name: write(tmp_path, name, [row])})
    assert len(prompts) == 1 and prompts[0].category == HUB[name].category and prompts[0].subtask == name
    if first_turn is not None:
        assert prompts[0].turns[0] == first_turn
    if name == "mt-bench-prompts":
        assert prompts[0].turns == ("Write a poem.", "Shorten it.") and prompts[0].id == "81"
    if name == "livecodebench":
        assert "### Question:\nRead n." in prompts[0].turns[0] and "# YOUR CODE HERE" in prompts[0].turns[0]


def test_a_large_dataset_is_cut_to_its_size_by_a_seed_0_shuffle(tmp_path):
    rows = [{"question": f"q{i}", "answer": ""} for i in range(HUB["gsm8k"].size + 20)]
    files = {"gsm8k": write(tmp_path, "gsm8k", rows)}
    first, again = load_suite("gsm8k", files), load_suite("gsm8k", files)
    assert len(first) == HUB["gsm8k"].size and [p.id for p in first] == [p.id for p in again]
    assert [p.id for p in first] != sorted((p.id for p in first), key=int)  # shuffled, not the file's head


def test_a_suite_prefixes_ids_and_makes_each_dataset_a_subtask(tmp_path):
    files = {name: write(tmp_path / name, name, [ROWS[name][0]]) for name in GROUPS["whiflash-coding"]}
    prompts = load_suite("whiflash-coding", files)
    assert [p.subtask for p in prompts] == list(GROUPS["whiflash-coding"])
    assert prompts[0].id == "humaneval/HumanEval/0" and {p.category for p in prompts} == {"coding"}


def test_offline_without_a_cached_copy_is_one_line_naming_the_dataset(monkeypatch, tmp_path):
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty"))
    with pytest.raises(UsageError, match=r"dataset 'gsm8k' \(openai/gsm8k@cc7b047b6e5b\) could not be loaded: it is "
                                         r"not in the datasets cache"):
        load_dataset("gsm8k")
    result = CliRunner().invoke(app, ["run", "--dataset", "whiflash-math", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1 and "could not be loaded" in result.output
