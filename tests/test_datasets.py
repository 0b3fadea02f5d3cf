"""Vendored datasets load, normalise and verify their checksums."""

from __future__ import annotations

import lzma
import shutil

import pytest

from specbench_cli.datasets import DATASET_DIR, DATASETS, load_dataset, parse_shard, select, write_vendored
from specbench_cli.core.errors import UsageError


def test_vendored_sets_have_their_sizes_and_shapes():
    spec = load_dataset("spec-bench")
    assert len(spec) == 480
    assert len({p.category for p in spec}) == 13
    assert {p.subtask for p in spec} == {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}
    assert all(len(p.turns) == 2 for p in spec if p.subtask == "mt_bench")
    mt = load_dataset("mt-bench")
    assert len(mt) == 80 and all(len(p.turns) == 2 for p in mt)
    assert spec[0].turns == mt[0].turns  # Spec-Bench's first 80 prompts are MT-Bench
    for name in ("aime24", "aime25"):
        aime = load_dataset(name)
        assert len(aime) == 30 and all(p.reference.isdigit() and "\\boxed{}" in p.turns[0] for p in aime)
    assert load_dataset("aime25")[0].reference == "70"


def test_checksum_mismatch_is_refused(tmp_path):
    shutil.copytree(DATASET_DIR / "aime25", tmp_path / "aime25")
    path = tmp_path / DATASETS["aime25"].path
    path.chmod(0o644)
    text = lzma.decompress(path.read_bytes()).decode()
    write_vendored(path, text.replace("bases", "basis", 1).encode())  # shipped compressed, as the real file
    with pytest.raises(UsageError, match="checksum"):
        load_dataset("aime25", base=tmp_path)


def test_user_jsonl_and_its_errors(tmp_path):
    good = tmp_path / "mine.jsonl"
    good.write_text('{"question_id": 7, "category": "chat", "turns": ["hi", "more"]}\n{"prompt": "solo"}\n')
    prompts = load_dataset(str(good))
    assert [p.turns for p in prompts] == [("hi", "more"), ("solo",)]
    assert [p.id for p in prompts] == ["7", "1"]  # a row without an id is named by its position
    assert prompts[1].category == "custom" and prompts[0].dataset == "mine"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["ok"]}\n{oops\n')
    with pytest.raises(UsageError, match="bad.jsonl:2"):
        load_dataset(str(bad))
    with pytest.raises(UsageError, match="not found"):
        load_dataset(str(tmp_path / "missing.jsonl"))


def test_limit_is_round_robin_across_subtasks_and_shards_partition():
    spec = load_dataset("spec-bench")
    chosen = select(spec, None, 12)
    assert len(chosen) == 12 and len({p.subtask for p in chosen}) == 6
    assert [p.id for p in select(spec, ["rag"], 3)] == ["481", "482", "483"]
    shards = [chosen[i::3] for i in range(3)]
    assert sorted(p.id for s in shards for p in s) == sorted(p.id for p in chosen)
    assert parse_shard(None, {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4"}) == (2, 4)
    with pytest.raises(UsageError):
        parse_shard("4/4", {})


def write_speed_bench(folder, turns_by_row):
    """A SPEED-Bench config folder in the format its prepare_data.py writes (test.parquet, all its columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    n = len(turns_by_row)
    pq.write_table(pa.table({"question_id": [f"q{i}" for i in range(n)], "category": ["coding", "writing"][:n],
                             "sub_category": ["py"] * n, "turns": turns_by_row, "source": ["src"] * n,
                             "src_id": [str(i) for i in range(n)], "difficulty": ["easy"] * n,
                             "multiturn": [len(t) > 1 for t in turns_by_row]}), folder / "test.parquet")


def test_speed_bench_reads_its_prepared_format_and_refuses_placeholders(tmp_path):
    write_speed_bench(tmp_path / "speed" / "qualitative", [["Write a sort."], ["Draft a poem.", "Now shorten it."]])
    for ref in ("speed", "speed/qualitative", "speed/qualitative/test.parquet"):  # root, config folder, file
        prompts = load_dataset(f"speed-bench:{tmp_path / ref}")
        assert [p.turns for p in prompts] == [("Write a sort.",), ("Draft a poem.", "Now shorten it.")]
        assert [(p.id, p.category, p.subtask, p.dataset) for p in prompts][1] == (
            "q1", "writing", "writing", "speed-bench-qualitative")
    write_speed_bench(tmp_path / "public" / "qualitative",
                      [["FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH\n\n{question}"]])
    with pytest.raises(UsageError, match="placeholders, not its prompts: prepare it with"):
        load_dataset(f"speed-bench:{tmp_path / 'public'}")
    with pytest.raises(UsageError, match="SPEED-Bench data not found"):
        load_dataset(f"speed-bench:{tmp_path / 'nowhere'}")
