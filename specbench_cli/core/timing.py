"""PhaseClock: per-round phase times without a host sync inside the round.

On CUDA each phase is a pair of `torch.cuda.Event(enable_timing=True)` recorded on the stream; the pairs
are resolved once, at the end of a turn, after one synchronize. On CPU the same calls read
`time.perf_counter_ns`. Every round's host wall time is read with perf_counter in both cases. The clock
name is written into the records so a reader knows which one was used.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

PHASES = ("route", "catchup", "extra_forward", "draft", "verify", "accept", "commit")
# Parts of a phase that a proposer times itself (inside `draft`; never added to the phase sums).
SUB_PHASES = ("draft_head", "reverify")  # reverify: inside `verify` (core.engine._exact_paths)


class PhaseClock:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.name = "cuda-event" if self.cuda else "perf_counter_ns"
        self._rounds: list[dict[str, list]] = []  # per round: phase -> [(start, end), ...]
        self._walls: list[int] = []
        self._round_start = 0
        self._pool: list[torch.cuda.Event] = []

    def start_round(self) -> None:
        self._rounds.append({})
        self._round_start = time.perf_counter_ns()

    def end_round(self) -> None:
        self._walls.append(time.perf_counter_ns() - self._round_start)

    @contextmanager
    def phase(self, name: str):
        """Time a phase; a name timed several times in a round (a drafter's head per tree level) adds up."""
        marks = self._rounds[-1]
        if self.cuda:
            start, end = self._event(), self._event()
            start.record()
            yield
            end.record()
        else:
            start = time.perf_counter_ns()
            yield
            end = time.perf_counter_ns()
        marks.setdefault(name, []).append((start, end))

    def _elapsed_ms(self, start, end) -> float:
        if self.cuda:
            self._pool += [start, end]
            return start.elapsed_time(end)
        return (end - start) / 1e6

    def _event(self) -> torch.cuda.Event:
        return self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)

    def resolve(self) -> list[dict[str, float]]:
        """Milliseconds per phase (absent phases are 0.0) and host `wall` for every round; then reset."""
        if self.cuda:
            torch.cuda.synchronize()
        rounds = []
        for marks, wall in zip(self._rounds, self._walls):
            row = {p: 0.0 for p in (*PHASES, *SUB_PHASES)}
            for name, pairs in marks.items():
                row[name] = sum(self._elapsed_ms(start, end) for start, end in pairs)
            row["wall"] = wall / 1e6
            rounds.append(row)
        self._rounds, self._walls = [], []
        return rounds


def sync(device: torch.device) -> None:
    """Wait for the device: used only at turn boundaries (TTFT and total decode time) and by measurements outside
    the loop (replay's draft times, tune's verify costs)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
