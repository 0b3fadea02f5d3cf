"""Parquet records, written as the run goes so a killed run keeps every finished prompt.

`rounds.parquet/` and `prompts.parquet/` are folders of part files, one part per finished prompt (all its
turns), which pandas and pyarrow read as one table (`pd.read_parquet(run / "rounds.parquet")`). `RunFolder`
(run_folder.py) writes them, rounds before prompts: a prompt counts as finished when its prompts part exists.
Column meanings are in docs/records.md.
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
    route_ms: float
    catchup_ms: float
    draft_ms: float
    draft_head_ms: float
    verify_ms: float
    accept_ms: float
    commit_ms: float
    wall_ms: float
    extra_forward_ms: float = NAN  # target forwards a method runs outside verify (SpS deferred=false)
    reverify_ms: float = NAN  # part of verify: a batch-invariant greedy tree's path verified again (core.engine)
    engine: str = "specbench"  # which engine decoded it (engines/: specbench, vllm)
    # Batch > 1 (run --batch-size): the sequence's slot, the sequences in the round's forward, and the batch round
    # (rows with the same batch_round share one forward and its phase times; -1 at batch 1).
    batch_slot: int = 0
    batch_size: int = 1
    batch_round: int = -1
    repeat: int = 0  # which pass over the selection (`run --repeat`); 0 in a run of one pass
    # the greedy replay (greedy_replay.py; -1 / NaN: not replayed: temperature > 0, --no-replay, another engine)
    replay_checked: int = -1  # output tokens compared with the reference target's greedy choice
    replay_off: int = -1  # of them, tokens the reference would not have chosen after the turn's earlier tokens
    replay_ties: int = -1  # of those, numeric ties (the reference's second choice, within the dtype's threshold)
    replay_first_off: int = -1  # output position of the first off token; -1: none
    replay_margin: float = float("nan")  # the largest reference logit margin of an off token (0: none off)
    replay_engine_error: float = float("nan")  # another engine's verify against the reference (greedy_replay.py)
    # The method's own per-round signals (`Route.extras`: a router's inputs and score, the catch-up backlog),
    # each written as a column of its own after the fixed ones; a vector as comma-separated text.
    extras: dict = field(default_factory=dict)


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
    engine: str = "specbench"  # which engine decoded it (engines/: specbench, vllm)
    repeat: int = 0  # which pass over the selection (`run --repeat`); 0 in a run of one pass
    # the greedy replay (greedy_replay.py; -1 / NaN: not replayed: temperature > 0, --no-replay, another engine)
    replay_checked: int = -1  # output tokens compared with the reference target's greedy choice
    replay_off: int = -1  # of them, tokens the reference would not have chosen after the turn's earlier tokens
    replay_ties: int = -1  # of those, numeric ties (the reference's second choice, within the dtype's threshold)
    replay_first_off: int = -1  # output position of the first off token; -1: none
    replay_margin: float = float("nan")  # the largest reference logit margin of an off token (0: none off)
    replay_engine_error: float = float("nan")  # another engine's verify against the reference (greedy_replay.py)


_ARROW = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "list[int]": pa.list_(pa.int64())}


def schema(cls: type) -> pa.Schema:
    """The fixed columns of a record class (a method's extras add columns of their own)."""
    return pa.schema([(f.name, _ARROW[f.type]) for f in dataclasses.fields(cls) if f.name != "extras"])


def row(record) -> dict:
    """A record as one table row: its fixed fields, then its extras as columns of their own."""
    values = dataclasses.asdict(record)
    extras = values.pop("extras", {})
    clash = sorted(set(extras) & set(values))
    if clash:
        raise ValueError(f"a method's round extras may not reuse a record column: {', '.join(clash)}")
    return {**values, **{k: _column_value(v) for k, v in extras.items()}}


def _column_value(value):
    if isinstance(value, (tuple, list)):
        return ",".join(f"{float(v):.6g}" for v in value)
    return value


def output_hash(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


RUN_TABLES = ("rounds", "prompts")  # a run's tables, in the order a prompt's parts are written (prompts marks it done)


def table(cls: type, records: list) -> pa.Table:
    """Records of one class as a table: the fixed columns typed by `schema`, then any extras' columns."""
    rows = [row(r) for r in records]
    fixed = schema(cls)
    names = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in fixed.names]
    extra = [pa.field(k, pa.array([r.get(k) for r in rows]).type) for k in names]
    return pa.Table.from_pylist(rows, schema=pa.schema([*fixed, *extra]))


def run_parts(rounds: list[RoundRecord], prompts: list[PromptRecord]) -> dict[str, pa.Table]:
    """One prompt's parts of a run folder (`RunFolder.write_prompt`)."""
    return {"rounds": table(RoundRecord, rounds), "prompts": table(PromptRecord, prompts)}


def read_table(run_dir: Path, name: str) -> pd.DataFrame:
    """Read `prompts` or `rounds` of a run (an empty frame with the fixed columns if nothing finished). The fixed
    columns keep their types; a method's extra columns are as written (missing in a part: null)."""
    folder = run_dir / f"{name}.parquet"
    cls = PromptRecord if name == "prompts" else RoundRecord
    parts = sorted(folder.glob("part-*.parquet")) if folder.is_dir() else []
    if not parts:
        return schema(cls).empty_table().to_pandas()
    fixed = schema(cls)
    tables = [_with_fixed_types(pq.read_table(p), fixed, _LATER[cls]) for p in parts]
    return pa.concat_tables(tables, promote_options="permissive").to_pandas()


# Columns added after records were first written, with what they mean in an older part (NaN: not measured).
_LATER = {PromptRecord: {"engine": "specbench", "repeat": 0},
          RoundRecord: {"engine": "specbench", "batch_slot": 0, "batch_size": 1, "batch_round": -1, "repeat": 0}}


def _with_fixed_types(table: pa.Table, fixed: pa.Schema, later: dict) -> pa.Table:
    """A part's fixed columns cast to their schema types, a fixed column it lacks (a column added later,
    such as extra_forward_ms) added as nulls or as `later`'s value, its extras kept."""
    columns = [table[f.name].cast(f.type) if f.name in table.column_names
               else pa.array([later.get(f.name)] * len(table), f.type) for f in fixed]
    extras = [n for n in table.column_names if n not in fixed.names]
    return pa.Table.from_arrays([*columns, *(table[n] for n in extras)],
                                schema=pa.schema([*fixed, *(table.schema.field(n) for n in extras)]))
