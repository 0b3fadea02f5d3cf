"""pld: prompt lookup decoding (Saxena 2023, apoorvumang/prompt-lookup-decoding).

For n = max_ngram down to min_ngram, find the earliest earlier occurrence of the sequence's last n tokens
that is followed by a full `num_pred_tokens` continuation, and draft that continuation as a chain."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specbench_cli.core.errors import UsageError
from specbench_cli.core.method import DecodeState, Method
from specbench_cli.core.tree import DraftTree


class PromptLookup(Method):
    name = "pld"

    @dataclass
    class Options:
        # The reference implementation's defaults: max_ngram_size=3, num_pred_tokens=10.
        max_ngram: int = 3
        min_ngram: int = 1
        num_pred_tokens: int = 10
        RANGES = {"max_ngram": (1, 64), "min_ngram": (1, 64), "num_pred_tokens": (1, 256)}  # checked before loading

        def __post_init__(self) -> None:
            if self.min_ngram > self.max_ngram:
                raise UsageError(f"pld min_ngram={self.min_ngram} is above max_ngram={self.max_ngram}")

    def propose_one(self, state: DecodeState) -> DraftTree:
        return DraftTree.chain(lookup(state.tokens, self.options.max_ngram, self.options.min_ngram,
                                      self.options.num_pred_tokens))


def lookup(tokens: list[int], max_ngram: int, min_ngram: int, num_pred: int) -> list[int]:
    seq = np.asarray(tokens)
    length = len(seq)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        # A match at i is usable when a full continuation follows it (i + n + num_pred <= length) and it is
        # not the trailing n-gram itself (i + n < length - n), as in the reference.
        last_start = min(length - n - num_pred, length - 2 * n - 1)
        if last_start < 0:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(seq, n)[: last_start + 1]
        hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        if len(hits):
            start = int(hits[0]) + n
            return seq[start:start + num_pred].tolist()
    return []
