"""Hybrid Verified Decoding (Su et al. 2026, arXiv 2606.01019): each round, predict the payoff of the
parameter-free cache draft before verifying it, and verify it only when the payoff is worth a round;
otherwise draft with EAGLE-3.

A round: look up the suffix-cache draft (SuffixDecoding's trees over this request and earlier outputs; the
cache warms on the run's warm-up prompts, which are never scored), describe it by the features of HVD
Table 9, and let a policy score it:
- `hvd`: the payoff predictor (an MLP, two hidden layers of 256, ReLU) predicts the draft's accepted length ŷ;
  the cache draft is verified when ŷ ≥ threshold (the paper's τ; its default 6), else EAGLE-3 drafts.
- `hvd-freq`: the same structure deciding by SuffixDecoding's own frequency score (HVD's Frequency-Based
  Hybrid baseline); the default threshold is ArcticInference's hybrid rule, "use the suffix draft when its score is
  at least the model drafter's speculation length" (`arctic_inference/vllm/model_runner.py`,
  `propose_draft_token_ids`), here EAGLE-3's tree depth.

EAGLE-3 catches up lazily after cache rounds (KV-only, as in WhiFlash); `--opt lazy_catchup=false` keeps it
in sync every round. Rounds record the source chosen ("suffix" or "eagle3"), the score and the features.

The features, identical live and in `specbench calibrate --method hvd` (which replays the suffix lookups
over greedy traces and labels each with the accepted length of its draft):
  suffix score, matched length, draft length; prompt length, generated length, relative position
  (generated / (prompt + generated)); over the last `HISTORY` rounds of the turn, the share of rounds that
  verified the cache draft and their mean accepted length; and the share of draft tokens that are
  whitespace, punctuation, line breaks, brackets and delimiters (a per-vocabulary class table built once
  from the tokenizer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from specbench_cli.core.method import DecodeState, Proposer, Route
from specbench_cli.core.options import proposer_options
from specbench_methods.checkpoints import locate, timed_as, warn_if_stale
from specbench_methods.eagle3 import Eagle3
from specbench_methods.hvd_features import CLASSES, FEATURES, HISTORY, History, features, token_classes  # noqa: F401
from specbench_methods.predictors import PayoffPredictor
from specbench_methods.router_policies import hvd_extras, verifies_cache
from specbench_methods.routed import RoutedMethod
from specbench_methods.suffix import Suffix, SuffixDraft
from specbench_cli.core.tree import DraftTree


class CacheDraft(Proposer):
    """The suffix draft the route already looked up: verifying it needs no further drafting."""

    name = "suffix"

    @dataclass
    class Lane:
        tree: DraftTree = field(default_factory=DraftTree)  # the sequence's draft the route looked up

    def propose_one(self, state: DecodeState) -> DraftTree:
        return self.lane(state).tree


class HybridVerified(RoutedMethod):
    """The shared structure; subclasses say how a cache draft is scored and what the threshold is by default."""

    PROPOSERS = {"suffix": Suffix, "eagle3": Eagle3}
    drafter_names = ("eagle3",)
    inherent_syncs = "EAGLE-3's own when it drafts; the cache lookup and the frequency score are host work"

    @dataclass
    class Options:
        threshold: float = math.nan  # the paper's τ; NaN = the method's default (hvd: the calibration card's, 6)
        lazy_catchup: bool = True
        suffix: Suffix.Options = proposer_options(Suffix.Options)  # SpecParams' defaults (HVD Table 7)
        # EAGLE-3 in HVD's setting (HVD seed; the EAGLE Qwen3 evaluation script): 32 tree tokens, depth 8, top-k 4.
        eagle3: Eagle3.Options = proposer_options(Eagle3.Options, depth=8, top_k=4, total_token=32)
        RANGES = {"threshold": (0, None)}  # checked before loading
        DEFAULT_TEXT = {"threshold": "calibrated (hvd) / eagle3.depth (hvd-freq)"}

    def __init__(self, options: Options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        self.classes = token_classes(model.tokenizer, int(model.model.config.vocab_size))

    @dataclass
    class Lane:
        history: History = field(default_factory=History)  # the turn's last rounds
        chose_cache: bool = False  # this round verifies the cache draft

    def bind(self) -> None:
        self.suffix, self.eagle3 = self.proposers["suffix"], self.proposers["eagle3"]
        self.cache = CacheDraft()

    def score(self, draft: SuffixDraft, x: np.ndarray) -> float:
        raise NotImplementedError

    def observe(self, state: DecodeState, new_tokens: list[int]) -> None:
        super().observe(state, new_tokens)
        lane = self.lane(state)
        lane.history.add(lane.chose_cache, max(len(new_tokens) - 1, 0))

    # ------------------------------------------------------------------------------------ routing
    def route(self, state: DecodeState) -> Route:
        lane = self.lane(state)
        draft = self.suffix.lookup(state)
        x = features(draft.score, draft.match_len, draft.tokens, state.prompt_len, len(state.tokens) - state.prompt_len,
                     lane.history, self.classes)
        score = self.score(draft, x)
        lane.chose_cache = verifies_cache(len(draft.tokens), score, self.tau)
        extras = hvd_extras(0, score, x)
        if lane.chose_cache:
            self.cache.lane(state).tree = draft.tree()
            return Route(self.cache, () if self.options.lazy_catchup else (self.eagle3,), extras)
        return Route(self.eagle3, extras={**extras, "backlog": state.target.length - self.eagle3.absorbed(state)})


class Hvd(HybridVerified):
    name = "hvd"
    calibration = "hvd"
    inherent_syncs = ("EAGLE-3's own when it drafts; the payoff predictor runs on the host, over host inputs, and the "
                      "cache lookup is host work")
    drafter_names = ("eagle3", "hvd")  # the payoff predictor is checked before anything loads
    how_to_make = {"hvd": "make it with `specbench calibrate --method hvd --model {model}`"}

    def __init__(self, options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        predictor, card = PayoffPredictor.load(locate(self.drafter_ref("hvd"), "hvd payoff predictor"))
        warn_if_stale(card, {"eagle3": self.drafter_ref("eagle3")}, self.name, self.model.spec.name,
                      timed_as(self.model.dtype, self.model.device))
        self.predictor = predictor  # stays on the CPU: its 13 inputs are host values, it costs microseconds
        self.tau = options.threshold if not math.isnan(options.threshold) else float(card.get("threshold", 6.0))

    @torch.inference_mode()
    def score(self, draft: SuffixDraft, x: np.ndarray) -> float:
        return float(self.predictor(torch.from_numpy(x)[None])[0])


class HvdFreq(HybridVerified):
    name = "hvd-freq"

    def __init__(self, options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        self.tau = options.threshold if not math.isnan(options.threshold) else float(options.eagle3.depth)

    def score(self, draft: SuffixDraft, x: np.ndarray) -> float:
        return draft.score
