"""baseline: plain autoregressive decoding through the same loop (an empty draft every round).

Speedups are measured against this, so both sides pay the same engine costs."""

from __future__ import annotations

from specbench_cli.core.method import DecodeState, Method
from specbench_cli.core.tree import DraftTree


class Baseline(Method):
    name = "baseline"
    drafts = False

    def propose_one(self, state: DecodeState) -> DraftTree:
        return DraftTree()
