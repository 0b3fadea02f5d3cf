"""A prompt while it is decoded, turn by turn, in any engine and beside any number of others; and a run's
throughput (output tokens of all requests over wall seconds), for runs that decode several at once."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from specbench_cli.core.turn import TurnResult
from specbench_cli.datasets import Prompt


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
    throughput is), beside the per-request rates the prompts table holds."""

    def __init__(self, clock: str = "perf_counter (specbench)") -> None:
        self.tokens = self.requests = 0
        self.clock = clock
        self.started = time.perf_counter()

    def start(self) -> None:
        self.started = time.perf_counter()

    def add(self, conv: Conversation) -> None:
        self.tokens += sum(len(r.output_ids) for _, r in conv.turns)
        self.requests += len(conv.turns)

    def line(self) -> str:
        return f"{self.tokens / max(time.perf_counter() - self.started, 1e-9):.1f} tok/s output"

    def summary(self) -> dict:
        seconds = time.perf_counter() - self.started
        return {"output_tokens": self.tokens, "requests": self.requests, "seconds": round(seconds, 3),
                "output_tokens_per_s": round(self.tokens / max(seconds, 1e-9), 3),
                "requests_per_s": round(self.requests / max(seconds, 1e-9), 4), "clock": self.clock}
