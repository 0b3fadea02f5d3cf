"""The small learned policies of the routed methods, and their artifact format.

Both read standardised inputs (the mean/std of the training inputs are buffers, saved with the weights) and
regress one number:
- `Router` (WhiFlash): the target's final hidden state h_t → ΔAL̂ = AL_eagle3 − AL_dflash;
- `PayoffPredictor` (Hybrid Verified Decoding): the cache draft's features → its accepted length ŷ.

An artifact is a folder with `config.json` (the card `specbench calibrate` writes: data, settings, metrics,
and what the constructor needs) and `<FILE>` (safetensors), which `load` reads strictly.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specbench_methods.checkpoints import CheckpointError


class Standardised(nn.Module):
    """x → net((x − mean) / std), squeezed to one number per row."""

    FILE = "model.safetensors"

    def __init__(self, inputs: int, net: nn.Module) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(inputs))
        self.register_buffer("std", torch.ones(inputs))
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x.float() - self.mean) / self.std).squeeze(-1)

    def fit_scale(self, x: torch.Tensor) -> None:
        """Take the training inputs' mean and std (constant inputs keep a unit scale)."""
        self.mean.copy_(x.mean(0))
        self.std.copy_(x.std(0).clamp_min(1e-4))

    @classmethod
    def from_card(cls, card: dict) -> Standardised:
        raise NotImplementedError

    @classmethod
    def load(cls, folder: Path) -> tuple[Standardised, dict]:
        from safetensors.torch import load_file

        card = json.loads((folder / "config.json").read_text())
        module = cls.from_card(card)
        missing, unexpected = module.load_state_dict(load_file(str(folder / cls.FILE)), strict=False)
        if missing or unexpected:
            raise CheckpointError(f"{folder / cls.FILE}: missing {missing}, unexpected {unexpected}")
        return module.eval(), card

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(folder / self.FILE))


class Router(Standardised):
    """WhiFlash's neural policy: Linear(d, d/8) → GELU → Dropout → Linear(d/8, 1) = ΔAL̂."""

    FILE = "router.safetensors"

    def __init__(self, hidden: int, dropout: float = 0.1) -> None:
        super().__init__(hidden, nn.Sequential(nn.Linear(hidden, hidden // 8), nn.GELU(), nn.Dropout(dropout),
                                               nn.Linear(hidden // 8, 1)))

    @classmethod
    def from_card(cls, card: dict) -> Router:
        return cls(int(card["hidden_size"]), float(card.get("dropout", 0.1)))


class PayoffPredictor(Standardised):
    """HVD's payoff predictor: an MLP with two hidden layers of 256 and ReLU (the HVD seed) over the cache draft's
    features (`specbench_methods.hvd_features.FEATURES`), predicting how many of its tokens the target will accept."""

    FILE = "predictor.safetensors"
    on_host = True  # its inputs are host values: it stays on the CPU whatever the target's device (no sync to read it)

    def __init__(self, inputs: int, width: int = 256) -> None:
        super().__init__(inputs, nn.Sequential(nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                               nn.Linear(width, 1)))

    @classmethod
    def from_card(cls, card: dict) -> PayoffPredictor:
        return cls(len(card["features"]), int(card.get("width", 256)))
