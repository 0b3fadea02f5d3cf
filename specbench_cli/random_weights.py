"""Random weights of a real architecture (`--target random:NAME[:SEED]`, `models.RandomWeights`).

The model is built from NAME's published config.json on the run's device and dtype, without the library's own
initialisation, and every parameter is then drawn from its own generator, seeded by the run's seed and the
parameter's name: the same seed, device and dtype give the same weights in any process, whatever order the
parameters are built in. Matrices are drawn N(0, initializer_range) as the architecture's own initialisation
draws them; norms are ones and biases zeros. Such a target reads prompts with the embedded tokenizer
(architectures/README.md).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from specbench_cli.models import ARCHITECTURES, RandomWeights


def build(weights: RandomWeights, device: torch.device, dtype: torch.dtype, folder: Path | None = None) -> torch.nn.Module:
    """NAME's architecture on `device` in `dtype`, its weights drawn from the seed (`draw`). Its config.json is
    read from `folder` (the embedded model's, which `loading` converts), else the package's `architectures/NAME`."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    config = AutoConfig.from_pretrained(folder or ARCHITECTURES / weights.architecture)
    with torch.device(device), no_init_weights():  # the library's initialisation would be drawn and thrown away
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.tie_weights()  # tie_word_embeddings: one matrix, as a loaded checkpoint has it (the library ties it in init)
    draw(model, weights.seed, config.initializer_range)
    return model.eval()


@torch.no_grad()
def draw(model: torch.nn.Module, seed: int, std: float) -> None:
    """Every parameter from a generator of its own (tied weights are one parameter, drawn once)."""
    for name, param in model.named_parameters():
        if param.is_meta:  # an architecture built on the meta device (to count its parameters) holds no values
            continue
        if param.dim() > 1:
            generator = torch.Generator(device=param.device).manual_seed(parameter_seed(seed, name))
            param.normal_(0.0, std, generator=generator)
        elif "norm" in name:
            param.fill_(1.0)
        else:
            param.zero_()


def parameter_seed(seed: int, name: str) -> int:
    """A 63-bit seed from the run's seed and a parameter's name (Python's own hash of a str changes by process)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
