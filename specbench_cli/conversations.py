"""A prompt while it is decoded, turn by turn, in any engine and beside any number of others: its turns, each
turn's seed, the records its turns make; and a run's throughput (output tokens of all requests over wall
seconds), for runs that decode several at once."""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specbench_cli.analysis.metrics import tau
from specbench_cli.core.timing import PHASES, SUB_PHASES
from specbench_cli.core.turn import TurnResult
from specbench_cli.datasets import Prompt
from specbench_cli.records import NAN, PromptRecord, RoundRecord, output_hash
from specbench_cli.greedy_replay import NOT_REPLAYED, Replayed, replay_columns

if TYPE_CHECKING:
    from specbench_cli.inputs import Plan


@dataclass
class Conversation:
    """A prompt's turns so far (each turn's ids and result) and the chat they make: each turn sees the model's
    own earlier answers."""

    index: int  # the prompt's position in the run's selection
    prompt: Prompt
    messages: list[dict] = field(default_factory=list)
    turns: list[tuple[list[int], TurnResult]] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # the ids of the turn being decoded

    @property
    def finished(self) -> bool:
        return len(self.turns) == len(self.prompt.turns)

    @property
    def turn(self) -> int:
        """The number of the next (or current) turn."""
        return len(self.turns)

    def next_ids(self, text) -> list[int]:
        """The next turn's prompt ids (`text` encodes chats: a LoadedModel): the chat so far and the next user turn."""
        self.messages.append({"role": "user", "content": self.prompt.turns[len(self.turns)]})
        self.pending = text.encode_chat(self.messages)
        return self.pending

    def add(self, result: TurnResult, text) -> None:
        """The current turn's result; its answer joins the chat."""
        self.turns.append((self.pending, result))
        self.messages.append({"role": "assistant", "content": text.decode(result.output_ids)})


class Throughput:
    """Output tokens of all requests over the wall time of the recorded part of the run (what a server's
    throughput is), beside the per-request rates the prompts table holds. The time counted runs from `start`
    to `stop` (or to now), summed over such spans: a job of an interleaved list counts its own prompts' time,
    not the other members'."""

    def __init__(self, clock: str = "perf_counter (specbench)") -> None:
        self.tokens = self.requests = 0
        self.clock = clock
        self.spent = 0.0  # seconds of the spans that have stopped
        self.started: float | None = time.perf_counter()

    def start(self) -> None:
        self.started = time.perf_counter()

    def stop(self) -> None:
        self.spent, self.started = self.seconds(), None

    def seconds(self) -> float:
        return self.spent + (time.perf_counter() - self.started if self.started is not None else 0.0)

    def add(self, conv: Conversation) -> None:
        self.tokens += sum(len(r.output_ids) for _, r in conv.turns)
        self.requests += len(conv.turns)

    def line(self) -> str:
        return f"{self.tokens / max(self.seconds(), 1e-9):.1f} tok/s output"

    def summary(self) -> dict:
        seconds = self.seconds()
        return {"output_tokens": self.tokens, "requests": self.requests, "seconds": round(seconds, 3),
                "output_tokens_per_s": round(self.tokens / max(seconds, 1e-9), 3),
                "requests_per_s": round(self.requests / max(seconds, 1e-9), 4), "clock": self.clock}


def turn_seed(seed: int, prompt: Prompt, turn: int) -> int:
    """A per-turn seed, so a resumed or sharded run (in any engine) draws the same samples as a whole one."""
    return zlib.crc32(f"{seed}/{prompt.dataset}/{prompt.id}/{turn}".encode())


def turn_records(plan: Plan, run_name: str, clock: str, decode_text, index: int, prompt: Prompt,
                 turns: list[tuple[list[int], TurnResult]], engine: str = "specbench",
                 replays: list[Replayed] | None = None):
    """A decoded prompt's rows: one `PromptRecord` per turn, one `RoundRecord` per round (any engine's turns);
    `replays`: each turn's greedy replay (greedy_replay.py), where one ran."""
    c = plan.config
    common = dict(run=run_name, method=c.method, model=c.model, dataset=prompt.dataset,
                  category=prompt.category, subtask=prompt.subtask, prompt_id=prompt.id)
    rounds, rows = [], []
    for t, (ids, r) in enumerate(turns):
        decode_tokens = len(r.output_ids) - 1
        rows.append(PromptRecord(**common, turn=t, index=index, prompt_tokens=len(ids),
                                 new_tokens=len(r.output_ids), decode_tokens=decode_tokens, rounds=len(r.rounds),
                                 ttft_ms=r.ttft_ms, decode_ms=r.decode_ms,
                                 tokens_per_s=decode_tokens / (r.decode_ms / 1e3) if r.decode_ms > 0 else NAN,
                                 tau=tau(decode_tokens, len(r.rounds)), stop_reason=r.stop_reason, clock=clock,
                                 output_hash=output_hash(r.output_ids), output_text=decode_text(r.output_ids),
                                 output_ids=r.output_ids, prompt_ids=ids, engine=engine,
                                 **replay_columns(replays[t] if replays else NOT_REPLAYED)))
        for k, info in enumerate(r.rounds):
            ms = {f"{p}_ms": info.phases.get(p, NAN) for p in (*PHASES, *SUB_PHASES, "wall")}
            rounds.append(RoundRecord(**common, turn=t, round=k, proposer=info.proposer, tree_size=info.tree_size,
                                      draft_depth=info.draft_depth, accepted=info.accepted, emitted=info.emitted,
                                      kv_len=info.kv_len, target_forwards=info.target_forwards, **ms,
                                      engine=engine, batch_slot=info.slot, batch_size=info.batch,
                                      batch_round=info.batch_round, extras=info.extras))
    return rounds, rows
