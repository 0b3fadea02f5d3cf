"""Parquet records, written as the run goes so a killed run keeps every finished prompt.

`rounds.parquet/` and `prompts.parquet/` are folders of part files, one part per finished prompt (all its
turns), which pandas and pyarrow read as one table (`pd.read_parquet(run / "rounds.parquet")`). A part is
written to a temporary name and renamed, rounds before prompts: a prompt counts as finished when its
prompts part exists. Column meanings are in the README ("Records").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from specbench_cli.folders import write_atomically

NAN = float("nan")


@dataclass
class Identity:
    """Columns that say which run, prompt and turn a row belongs to (first in both tables)."""

    run: str
    method: str
    model: str
    dataset: str
    category: str
    subtask: str
    prompt_id: str
    turn: int


@dataclass
class RoundRecord(Identity):
    round: int
    proposer: str
    tree_size: int
    draft_depth: int
    accepted: int
    emitted: int
    kv_len: int
    target_forwards: int
    backlog: int
    entropy: float
    router_score: float
    features: str  # the policy's input vector, comma-separated (HVD's FEATURES order); "" for other methods
    route_ms: float
    catchup_ms: float
    draft_ms: float
    draft_head_ms: float
    verify_ms: float
    accept_ms: float
    commit_ms: float
    wall_ms: float
    extra_forward_ms: float = NAN  # target forwards a method runs outside verify (SpS deferred=false)


@dataclass
class PromptRecord(Identity):
    index: int  # position of the prompt in this run's selection
    prompt_tokens: int
    new_tokens: int  # all tokens emitted, the prefill's first one included
    decode_tokens: int  # tokens emitted by decode rounds (new_tokens - 1)
    rounds: int
    ttft_ms: float
    decode_ms: float
    tokens_per_s: float  # decode_tokens / decode time
    tau: float  # decode_tokens / rounds: mean acceptance length, bonus token included
    stop_reason: str
    clock: str
    output_hash: str
    output_text: str
    output_ids: list[int]
    # the turn's prompt as the target saw it (chat template applied): report recomputes logits over it to tell a
    # numeric tie from a mismatch
    prompt_ids: list[int] = field(default_factory=list)


_ARROW = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "list[int]": pa.list_(pa.int64())}


def schema(cls: type) -> pa.Schema:
    return pa.schema([(f.name, _ARROW[f.type]) for f in dataclasses.fields(cls)])


def output_hash(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


class RunWriter:
    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self.rounds_dir = run_dir / "rounds.parquet"
        self.prompts_dir = run_dir / "prompts.parquet"

    def create(self, config: dict) -> None:
        self.rounds_dir.mkdir(parents=True, exist_ok=True)
        self.prompts_dir.mkdir(parents=True, exist_ok=True)
        self.write_json("run.json", config)

    def write_json(self, name: str, payload: dict) -> None:
        write_atomically(self.dir / name, lambda tmp: tmp.write_text(json.dumps(payload, indent=2, default=str)))

    def finished(self) -> set[int]:
        """Selection indices whose prompts part exists; stray rounds parts of unfinished prompts are removed."""
        done = {int(p.stem.split("-")[1]) for p in self.prompts_dir.glob("part-*.parquet")}
        for part in self.rounds_dir.glob("part-*.parquet"):
            if int(part.stem.split("-")[1]) not in done:
                part.unlink()
        for tmp in self.dir.rglob(".*.tmp"):
            tmp.unlink()
        return done

    def write_prompt(self, index: int, rounds: list[RoundRecord], turns: list[PromptRecord]) -> None:
        self._write(self.rounds_dir, index, RoundRecord, rounds)
        self._write(self.prompts_dir, index, PromptRecord, turns)

    @staticmethod
    def _write(folder: Path, index: int, cls: type, rows: list) -> None:
        table = pa.Table.from_pylist([dataclasses.asdict(r) for r in rows], schema=schema(cls))
        write_atomically(folder / f"part-{index:05d}.parquet", lambda tmp: pq.write_table(table, tmp))


def read_table(run_dir: Path, name: str) -> pd.DataFrame:
    """Read `prompts` or `rounds` of a run (an empty frame with the right columns if nothing finished)."""
    folder = run_dir / f"{name}.parquet"
    cls = PromptRecord if name == "prompts" else RoundRecord
    parts = sorted(folder.glob("part-*.parquet")) if folder.is_dir() else []
    if not parts:
        return schema(cls).empty_table().to_pandas()
    return pa.concat_tables([pq.read_table(p, schema=schema(cls)) for p in parts]).to_pandas()
