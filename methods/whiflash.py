"""WhiFlash (Kwon et al. 2026, arXiv 2606.07710): per-round routing between an autoregressive drafter
(EAGLE-3, a tree) and a block-diffusion drafter (DFlash, a chain), sharing one target.

Each round a policy reads the target at the newest committed position and picks a drafter:
- `whiflash-entropy`: H_t, the entropy of the target's next-token distribution; EAGLE-3 when
  H_t > threshold_entropy (uncertain text suits the tree), else DFlash. threshold_entropy per category comes from
  `specbench calibrate --method whiflash-entropy` (or `--opt threshold=`).
- `whiflash-neural`: an MLP on the target's final-layer hidden state h_t, Linear(d → d/8) → GELU →
  dropout → Linear(d/8 → 1), predicting ΔAL = AL_eagle3 − AL_dflash; EAGLE-3 when ΔAL̂ > threshold_ΔAL, a
  threshold that folds in the two drafters' latencies (from `specbench calibrate --method whiflash-neural`).

Lazy catch-up: the idle drafter does nothing; both only keep references to the committed positions' target
features. On a switch, the incoming drafter absorbs the backlog in one batch, KV-only (EAGLE-3: keys and
values of the backlog rows, the full layer on the newest row only; DFlash computes nothing but context
keys/values anyway). `--opt lazy_catchup=false` is the always-in-sync ablation (both drafters catch up every
round) and `--opt kv_only=false` runs EAGLE-3's whole layer over the backlog (WhiFlash Table 3).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch

from specbench_cli.core.host_copy import to_device
from specbench_cli.core.method import DecodeState, Method, Proposer, Route
from specbench_cli.core.options import proposer_options
from specbench_methods.checkpoints import CheckpointError, locate, timed_as, warn_if_stale
from specbench_methods.dflash import DFlash
from specbench_methods.eagle3 import Eagle3
from specbench_methods.layers import causal_mask
from specbench_methods.predictors import Router
from specbench_methods.router_policies import category_threshold, eagle3_by_entropy, eagle3_by_score, whiflash_extras
from specbench_methods.routed import RoutedMethod
from specbench_cli.core.target import Target


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(logits), on the device."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum()


class FullLayerCatchUp(Eagle3):
    """EAGLE-3 that runs its whole layer over the backlog (outputs discarded): WhiFlash's `kv_only=false`
    ablation of the KV-only catch-up; each sequence's backlog over its own cache."""

    def catch_up(self, states: list[DecodeState]) -> None:
        for state in states:
            super().catch_up([state])

    def backlog_kv(self, states: list[DecodeState], feats: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor):
        (state,) = states
        mask = causal_mask(feats.shape[0], self.absorbed(state), feats.device)
        _, kv = self.draft.step(feats, ids, positions, self.lane(state).kv.view(), mask)
        return kv


class WhiFlash(RoutedMethod):
    PROPOSERS = {"eagle3": Eagle3, "dflash": DFlash}
    drafter_names = ("eagle3", "dflash")
    # The policy's score at the newest committed position comes to the host with the round's tokens (greedy, and the
    # prefill's token); a sampled round reads it on its own.
    inherent_syncs = "EAGLE-3's or DFlash's own; sampling: one per round, the policy's score to host"
    reads_ahead = True
    needs_artifact = False  # True: no --opt threshold can stand in for the artifact (the neural router)

    @dataclass
    class Options:
        threshold: float = math.nan  # the policy's threshold; NaN = the calibrated value (per category for the entropy policy)
        lazy_catchup: bool = True
        kv_only: bool = True
        eagle3: Eagle3.Options = proposer_options(Eagle3.Options)  # WhiFlash Table 7: depth 8, top-k 10, 60 tokens
        dflash: DFlash.Options = proposer_options(DFlash.Options)  # the checkpoint's block (16 for the z-lab drafters)
        # The neural policy's threshold is a predicted ΔAL, which may be negative.
        RANGES = {"threshold": (None, None)}
        DEFAULT_TEXT = {"threshold": "calibrated"}

    def __init__(self, options: Options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        self.calibrated = self._calibration()

    def bind(self) -> None:
        self.eagle3, self.dflash = self.proposers["eagle3"], self.proposers["dflash"]

    def build(self, name: str, cls: type[Method]) -> Proposer:
        if name == "eagle3" and not self.options.kv_only:
            cls = FullLayerCatchUp
        return super().build(name, cls)

    @classmethod
    def reads_calibration(cls, options: Options) -> bool:
        return cls.needs_artifact or math.isnan(options.threshold)  # --opt threshold=T stands in for the card

    def _calibration(self) -> dict:
        """The policy's calibration card (config.json of its artifact folder), {} when none is needed."""
        if not self.reads_calibration(self.options):
            return {}
        ref = self.given_drafter(self.calibration)
        if not ref:
            raise CheckpointError(f"{self.name} has no calibration for model {self.model.spec.name}: run `specbench "
                                  f"calibrate --method {self.name} --model {self.model.spec.name}`"
                                  + ("" if self.needs_artifact else " or pass --opt threshold=T"))
        self.calibration_folder = locate(ref, self.calibration)
        card = json.loads((self.calibration_folder / "config.json").read_text())
        warn_if_stale(card, {n: self.drafter_ref(n) for n in self.drafter_names}, self.name, self.model.spec.name,
                      timed_as(self.model.dtype, self.model.device))
        return card

    # ------------------------------------------------------------------------------------ what profiling times
    def switching_probes(self, target: Target, length: int, backlogs: list[int], generator: torch.Generator):
        """`profile --switching` measures the switch into EAGLE-3: its round and its catch-up."""
        return self.eagle3.switching_probes(target, length, backlogs, generator)

    def switching_room(self) -> int:
        return self.eagle3.switching_room()

    # ------------------------------------------------------------------------------------ routing
    def route(self, state: DecodeState) -> Route:
        use_eagle3, h, score = self.decide(state)
        chosen, idle = (self.eagle3, self.dflash) if use_eagle3 else (self.dflash, self.eagle3)
        backlog = state.target.length - chosen.absorbed(state)
        return Route(chosen, () if self.options.lazy_catchup else (idle,), extras=whiflash_extras(backlog, h, score))

    def decide(self, state: DecodeState) -> tuple[bool, float, float]:
        """(EAGLE-3?, entropy, score) for this round."""
        raise NotImplementedError

    def signal(self, state: DecodeState) -> float:
        """The policy's input at the newest committed position: read with the round's tokens where the loop did
        (`read_ahead`), else now."""
        if state.ahead is not None:
            return float(state.ahead)
        newest = to_device([len(state.target.last_path) - 1], state.target.device, torch.long)  # after commit()
        return float(self.read_ahead(state.target, state.next_logits, newest))


class WhiFlashEntropy(WhiFlash):
    name = "whiflash-entropy"
    calibration = "whiflash-entropy"
    optional_drafters = ("whiflash-entropy",)  # calibrated thresholds; --opt threshold=T stands in

    def threshold(self, category: str) -> float:
        if not math.isnan(self.options.threshold):
            return self.options.threshold
        return category_threshold(self.calibrated.get("thresholds", {}), self.calibrated["threshold"], category)

    def read_ahead(self, target: Target, logits: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        return entropy(logits)

    def decide(self, state: DecodeState) -> tuple[bool, float, float]:
        h = self.signal(state)
        return eagle3_by_entropy(h, self.threshold(state.context.get("category", ""))), h, math.nan


class WhiFlashNeural(WhiFlash):
    name = "whiflash-neural"
    calibration = "whiflash-neural"
    needs_artifact = True
    drafter_names = ("eagle3", "dflash", "whiflash-neural")  # the router is checked before anything loads
    how_to_make = {"whiflash-neural": "make it with `specbench calibrate --method whiflash-neural --model {model}`"}

    def __init__(self, options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        router, config = Router.load(self.calibration_folder)
        self.router = router.to(model.device)
        self.layer = int(config.get("layer", model.model.config.num_hidden_layers - 1))
        self.tau = options.threshold if not math.isnan(options.threshold) else float(config["threshold"])

    def attach(self, target: Target) -> None:
        super().attach(target)
        target.capture([self.layer])

    @torch.inference_mode()
    def read_ahead(self, target: Target, logits: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        return self.router(target.captured[self.layer].index_select(0, row)[0])

    def decide(self, state: DecodeState) -> tuple[bool, float, float]:
        score = self.signal(state)
        return eagle3_by_score(score, self.tau), math.nan, score
