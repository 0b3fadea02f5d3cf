"""Drafters that read the target's hidden states (EAGLE-3, DART, DFlash, ConFu).

They name the target layers they read (`capture`), ask the target to keep those layers' outputs before
each prefill, and collect, per sequence, the rows of every committed position (the prefill's prompt, then each
round's accepted path) until they next draft. Nothing is computed while collecting, which is what lets a routed
method leave a drafter idle and catch it up later in one batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specbench_cli.core.compiling import CompiledSteps
from specbench_cli.core.method import DecodeState, Method
from specbench_cli.core.target import Target
from specbench_methods.layers import Apart, Slots


class FeatureDrafter(CompiledSteps, Method):
    """With `--compile` a subclass runs its draft steps through `graphs` (`CompiledSteps`), warming them on
    `blank_slots` and `own_keys_only`."""

    capture: list[int]  # target decoder layers whose outputs are concatenated, low -> high

    @dataclass
    class Lane:
        pending: list[torch.Tensor] = field(default_factory=list)  # committed rows the drafter has not seen

    def _apart_step(self, h, ids, positions, k, v, mask, **static):
        """A draft network's `step` (EAGLE-3's and DART's) as a compiled graph runs it: over whole buffers."""
        return self.draft.step(h, ids, positions, Apart(k, v), mask, **static)

    @property
    def device(self) -> torch.device:
        return self.draft.fc.weight.device

    def blank_slots(self, batch: int) -> Slots:
        """Zero round buffers [batch, kv heads, capacity, d] of the draft's dtype, nothing cached."""
        c, weight = self.draft.config, self.draft.fc.weight
        return Slots(*(weight.new_zeros(batch, c.kv_heads, self.capacity, c.head_dim) for _ in "kv"), 0)

    def own_keys_only(self, batch: int, rows: int) -> torch.Tensor:
        """A step's mask [batch, rows, rows] over nothing cached: each row sees itself."""
        return torch.eye(rows, dtype=torch.bool, device=self.device).expand(batch, -1, -1)

    def attach(self, target: Target) -> None:
        target.capture(self.capture)

    def _features(self, target: Target) -> torch.Tensor:
        return torch.cat([target.captured[i] for i in self.capture], dim=-1)

    def start(self, state: DecodeState) -> None:
        self.lane(state).pending = [self._features(state.target)]  # the prompt's rows

    def observe(self, state: DecodeState, new_tokens: list[int]) -> None:
        self.lane(state).pending.append(self._features(state.target))  # the accepted path's rows, root first

    def take_pending(self, state: DecodeState, seen: int) -> torch.Tensor:
        """Features of the committed positions the drafter has not seen (it has seen `seen` of them)."""
        lane = self.lane(state)
        feats = torch.cat(lane.pending)
        lane.pending = []
        assert seen + feats.shape[0] == state.target.length, "drafter and target disagree on the committed length"
        return feats
