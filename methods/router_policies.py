"""Each router's decision and the round extras it records, engine-neutral: one function per rule, called by the
routed methods in our engine (methods/whiflash.py, methods/hvd.py) and by their proposers inside vLLM
(specbench_cli/engines/vllm_whiflash.py, vllm_hvd.py), so that both engines decide by the same rule and write the
same columns. Imports only the standard library: vLLM's process imports it.

- WhiFlash-entropy: EAGLE-3 when the entropy of the target's next-token distribution exceeds the threshold of the
  prompt's category (calibrated per category; `--opt threshold` stands in for all), else DFlash.
- WhiFlash-neural: EAGLE-3 when the router's predicted ΔAL = AL_eagle3 − AL_dflash exceeds its threshold.
- HVD / HVD-freq: the suffix-cache draft is verified when it has tokens and its score (the payoff predictor's, or
  SuffixDecoding's frequency score) reaches the threshold, else EAGLE-3 drafts.
"""

from __future__ import annotations

import math


def category_threshold(per_category: dict[str, float], default: float, category: str,
                       given: float = math.nan) -> float:
    """WhiFlash-entropy's threshold for a prompt: `given` (--opt threshold) when set, else the calibrated one of its
    category, else the calibrated default."""
    if not math.isnan(given):
        return given
    return float(per_category.get(category, default))


def eagle3_by_entropy(entropy: float, threshold: float) -> bool:
    """WhiFlash-entropy: uncertain text suits EAGLE-3's tree, confident text DFlash's block."""
    return entropy > threshold


def eagle3_by_score(score: float, threshold: float) -> bool:
    """WhiFlash-neural: the router predicts EAGLE-3's acceptance length gain over DFlash's."""
    return score > threshold


def verifies_cache(draft_tokens: int, score: float, threshold: float) -> bool:
    """HVD and HVD-freq: the cache draft, when there is one and its score reaches the threshold."""
    return draft_tokens > 0 and score >= threshold


def whiflash_extras(backlog: int, entropy: float, score: float) -> dict:
    """A WhiFlash round's recorded signals (NaN for the policy's unused one)."""
    return {"backlog": backlog, "entropy": entropy, "router_score": score}


def hvd_extras(backlog: int, score: float, features) -> dict:
    """An HVD round's recorded signals: the tokens the chosen drafter catches up, the score, the features."""
    return {"backlog": backlog, "router_score": score, "features": tuple(float(v) for v in features)}
