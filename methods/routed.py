"""Routed methods by composition: a router that holds its proposers by name and picks one per round.

A `RoutedMethod` names its proposers in `PROPOSERS` (name -> the proposer's method class); its Options hold
the router's own settings and, per proposer, a field made by `proposer_options` holding that proposer's own
Options, so `--opt eagle3.depth=4 --opt dflash.block_size=8 --opt threshold=1.2` is parsed and range-checked
by each proposer's own class. Every lifecycle hook reaches every proposer (`attach`, `start`, `observe`,
`finish`, `absorb`), so a proposer's cross-turn or cross-prompt state (a suffix cache) is kept whichever proposer
the router picked; the router adds only `route` and what it keeps itself.
"""

from __future__ import annotations

from typing import ClassVar

from specbench_cli.core.method import DecodeState, Method, Proposer, Router
from specbench_cli.core.target import Target


class RoutedMethod(Router):
    """One router and one of each proposer for every sequence (what each keeps per sequence is in the sequence's
    state); a round routes every sequence, then each proposer drafts at once for the sequences sent to it
    (core/engine.py)."""

    PROPOSERS: ClassVar[dict[str, type[Method]]] = {}  # name (= its Options field) -> proposer class

    def __init__(self, options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        self.proposers: dict[str, Proposer] = {name: self.build(name, cls) for name, cls in self.PROPOSERS.items()}
        self.bind()

    def bind(self) -> None:
        """Point the router's own names at its proposers (after building them)."""

    def serve(self, lanes: int) -> None:
        for p in self.proposers.values():
            p.serve(lanes)

    def build(self, name: str, cls: type[Method]) -> Proposer:
        """The proposer `name`, made with its own options (a subclass may build a variant: an ablation)."""
        return cls(getattr(self.options, name), self.model, self.drafters)

    def attach(self, target: Target) -> None:
        for p in self.proposers.values():
            p.attach(target)

    def start(self, state: DecodeState) -> None:
        for p in self.proposers.values():
            p.start(state)

    def observe(self, state: DecodeState, new_tokens: list[int]) -> None:
        for p in self.proposers.values():  # an idle model-based proposer only keeps the rows' features: no compute
            p.observe(state, new_tokens)

    def finish(self, state: DecodeState) -> None:
        for p in self.proposers.values():
            p.finish(state)

    def absorb(self, output_ids: list[int]) -> None:
        for p in self.proposers.values():
            p.absorb(output_ids)
