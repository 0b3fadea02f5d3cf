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
    "swe-bench-verified": ({"repo": "a/b", "instance_id": "a__b-2", "problem_statement": "It hangs.", "version": "1"},
                           "Problem Statement:\nIt hangs.\nPlease fix the issue described above."),
    "ultrachat": ({"prompt": "Tell me about tea.", "prompt_id": "9f1c",
                   "messages": [{"content": "Tell me about tea.", "role": "user"}, {"content": "Tea is", "role": "assistant"}]},
                  "Tell me about tea."),
    "wildchat": ({"conversation_hash": "h1", "model": "gpt-4", "turn": 1, "language": "English", "toxic": False,
                  "redacted": False, "conversation": [{"content": "Hi there", "role": "user", "language": "English"},
                                                      {"content": "Hello!", "role": "assistant", "language": "English"}]},
                 "Hi there"),
    "agentinstruct": ({"id": "os_0", "conversations": [
        {"from": "human", "loss": False, "value": "You are an agent in a shell."}, {"from": "gpt", "loss": True, "value": "OK."},
        {"from": "human", "loss": False, "value": "List the files."}, {"from": "gpt", "loss": True, "value": "ls"},
        {"from": "human", "loss": False, "value": "a.txt"}]}, "You are an agent in a shell."),
    "codealpaca": ({"instruction": "Reverse a list.", "input": "[1, 2]", "output": "x[::-1]"}, "Reverse a list.\n\nInput:\n[1, 2]"),
    "magicoder": ({"instruction": "Implement a stack.", "response": "class Stack: ..."}, "Implement a stack."),
    "cnn-dailymail": ({"article": "A storm hit the coast.", "highlights": "Storm.", "id": "c1"},
                      "Summarize the following news article.\n\nA storm hit the coast."),
    "govreport": ({"report": "The agency found gaps.", "summary": "Gaps."},
                  "Summarize the following government report.\n\nThe agency found gaps."),
    "hotpotqa": ({"id": "5a8b", "question": "Who founded B?", "answer": "X", "type": "bridge", "level": "hard",
                  "supporting_facts": {"title": ["A"], "sent_id": [0]},
                  "context": {"title": ["A", "B"], "sentences": [["A is X.", " X lives in B."], ["B was founded by X."]]}},
                 "A: A is X. X lives in B.\n\nB: B was founded by X.\n\nAnswer the question using the paragraphs "
                 "above.\nQuestion: Who founded B?"),
    "musique": ({"id": "2hop_1", "question": "Where was X born?", "answer": "Y", "answerable": True,
                 "paragraphs": [{"idx": 0, "title": "X", "paragraph_text": "X was born in Y.", "is_supporting": True},
                                {"idx": 1, "title": "Z", "paragraph_text": "Z is a town.", "is_supporting": False}]},
                "X: X was born in Y.\n\nZ: Z is a town.\n\nAnswer the question using the paragraphs above.\n"
                "Question: Where was X born?"),
}


def write(folder: Path, name: str, rows: list[dict]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    if HUB[name].files and HUB[name].files[0].endswith(".jsonl"):  # served as json lines files
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
    if name == "agentinstruct":  # the instructions and the task; later human turns answer another agent
        assert prompts[0].turns == ("You are an agent in a shell.", "List the files.")
    if name == "livecodebench":
        assert "### Question:\nRead n." in prompts[0].turns[0] and "# YOUR CODE HERE" in prompts[0].turns[0]


def test_a_large_dataset_is_cut_to_its_size_by_a_seed_0_shuffle(tmp_path):
    rows = [{"question": f"q{i}", "answer": ""} for i in range(HUB["gsm8k"].size + 20)]
    files = {"gsm8k": write(tmp_path, "gsm8k", rows)}
    first, again = load_suite("gsm8k", files), load_suite("gsm8k", files)
    assert len(first) == HUB["gsm8k"].size and [p.id for p in first] == [p.id for p in again]
    assert [p.id for p in first] != sorted((p.id for p in first), key=int)  # shuffled, not the file's head


def test_a_suite_prefixes_ids_and_makes_each_dataset_a_subtask(tmp_path):
    names = [m.name for m in GROUPS["whiflash-coding"]]
    files = {name: write(tmp_path / name, name, [ROWS[name][0]]) for name in names}
    prompts = load_suite("whiflash-coding", files)
    assert [p.subtask for p in prompts] == names
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


def test_a_suite_uses_its_papers_size_and_category(tmp_path):
    """HVD measures 20 prompts per dataset and names its own workload families."""
    files = {m.name: write(tmp_path / m.name, m.name, [ROWS[m.name][0]])
             for m in GROUPS["hvd-suite"]}
    files["mbpp"] = write(tmp_path / "mbpp-many", "mbpp", [{**ROWS["mbpp"][0], "task_id": i} for i in range(50)])
    prompts = load_suite("hvd-suite", files)
    mbpp = [p for p in prompts if p.subtask == "mbpp"]
    assert len(mbpp) == 20 and {p.category for p in mbpp} == {"code"} and HUB["mbpp"].category == "coding"
    assert {p.category for p in prompts} == {"code", "multi-hop-qa", "long-context", "chat"}


def test_wildchat_keeps_english_non_toxic_rows_opened_by_a_user(tmp_path):
    row = ROWS["wildchat"][0]
    rows = [row, {**row, "conversation_hash": "h2", "language": "French"}, {**row, "conversation_hash": "h3", "toxic": True},
            {**row, "conversation_hash": "h4", "conversation": [{**row["conversation"][0], "content": "  "}]}]
    prompts = load_suite("wildchat", {"wildchat": write(tmp_path, "wildchat", rows)})
    assert [p.id for p in prompts] == ["h1"]
