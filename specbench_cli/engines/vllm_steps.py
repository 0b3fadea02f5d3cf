"""What specbench's routed proposers share inside vLLM (`vllm_hvd.py`, `vllm_whiflash.py`): the run's settings
file, the step log each decision is written to, and which of a request's tokens are new this step. Imports only
the standard library, so `vllm_routed.register` and both proposers can import it without importing each other.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV = "SPECBENCH_ROUTED"  # the settings file (JSON, `vllm_routed.Decisions.prepare`); unset = the plugin does nothing
READY = "ready"  # the log's first line: the proposer was built inside vLLM
HVD_METHODS = ("hvd", "hvd-freq")


def settings() -> dict:
    """The run's settings, inside vLLM."""
    return json.loads(Path(os.environ[ENV]).read_text())


class StepLog:
    """The proposer's side of the log: a ready line, then one line per decision."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the engine
        self.file.write(json.dumps({"event": READY, "pid": os.getpid()}) + "\n")

    def decision(self, request: str, source: str, **extras) -> None:
        self.file.write(json.dumps({"request": request, "source": source, "extras": extras}) + "\n")


class NewTokens:
    """Per request: how many of its tokens the proposer has seen, so each step's new ones are known."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def step(self, batch, i: int) -> tuple[int, int] | None:
        """(tokens seen before, tokens now) for row i of vLLM's input batch, None when nothing is new (a partial
        prefill) or no room is left; a request first seen starts at its prompt."""
        req_id, n = batch.req_ids[i], int(batch.num_tokens_no_spec[i])
        before = self.seen.get(req_id, int(batch.num_prompt_tokens[i]))
        if n <= before:
            return None
        self.seen[req_id] = n
        return before, n

    def forget(self, batch) -> None:
        """Forget the requests no longer in the batch."""
        for r in [r for r in self.seen if r not in batch.req_id_to_index]:
            del self.seen[r]
