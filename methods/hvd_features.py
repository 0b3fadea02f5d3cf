"""The features Hybrid Verified Decoding's payoff predictor reads (HVD Table 9), in a module of their own.

Three places compute them and must agree exactly: `hvd` live in our engine (methods/hvd.py), `specbench calibrate
--method hvd` over replayed traces, and the HVD proposer inside vLLM (specbench_cli/engines/vllm_hvd.py), which
runs in vLLM's own Python and so may import only numpy and the standard library from here.
"""

from __future__ import annotations

import unicodedata
from collections import deque
from dataclasses import dataclass, field

import numpy as np

CLASSES = ("whitespace", "punctuation", "line_break", "bracket", "delimiter")
FEATURES = ("suffix_score", "match_len", "draft_len", "prompt_len", "generated", "relative_position",
            "recent_cache_rate", "recent_accepted", *(f"{c}_share" for c in CLASSES))
HISTORY = 8  # rounds the recent-behaviour features look back over (our choice; the paper says "recent")
BRACKETS = frozenset("()[]{}<>")
DELIMITERS = frozenset(",;:|\t")


def token_classes(tokenizer, vocab: int) -> np.ndarray:
    """[vocab, len(CLASSES)] 0/1 table: which classes each token's text falls in (all 0 without a tokenizer)."""
    table = np.zeros((vocab, len(CLASSES)), dtype=np.float32)
    if tokenizer is None:
        return table
    n = min(vocab, len(tokenizer))
    for i, text in enumerate(tokenizer.batch_decode([[i] for i in range(n)])):
        table[i] = _classes(text)
    return table


def _classes(text: str) -> list[float]:
    visible = text.strip()
    return [float(bool(text) and text.isspace()),
            float(bool(visible) and all(unicodedata.category(c).startswith("P") for c in visible)),
            float("\n" in text),
            float(any(c in BRACKETS for c in text)),
            float(any(c in DELIMITERS for c in text))]


@dataclass
class History:
    """The turn's last `HISTORY` rounds: (verified the cache draft?, tokens accepted)."""

    rounds: deque = field(default_factory=lambda: deque(maxlen=HISTORY))

    def add(self, cache: bool, accepted: int) -> None:
        self.rounds.append((cache, accepted))

    def summary(self) -> tuple[float, float]:
        """(share of rounds that verified the cache draft, mean accepted length); zeros before any round."""
        if not self.rounds:
            return 0.0, 0.0
        return (sum(c for c, _ in self.rounds) / len(self.rounds),
                sum(a for _, a in self.rounds) / len(self.rounds))


def features(score: float, match_len: int, draft: list[int], prompt_len: int, generated: int, history: History,
             classes: np.ndarray) -> np.ndarray:
    """HVD Table 9's features of one cache lookup, in `FEATURES` order."""
    shares = classes[draft].mean(0) if draft else np.zeros(len(CLASSES), dtype=np.float32)
    rate, accepted = history.summary()
    return np.array([score, match_len, len(draft), prompt_len, generated, generated / max(prompt_len + generated, 1),
                     rate, accepted, *shares], dtype=np.float32)
