"""Tiny drafter checkpoints in each released format, random or distilled on the spot to a tiny target.

Every drafter is built, trained and written by its method's training recipe and the trainer users run
(`specbench_cli/training/`), on an in-memory corpus of the tiny target's greedy answers. Random drafters
(no corpus) check loading; distilled ones accept often, so the lossless tests exercise long accepted paths
through trees and chains. The fixtures only add format variants the trainer does not choose itself: the
speculators layout, head dims unlike the target's, q/k norm, a pinned mask token and feature layers.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from specbench_cli.models import ModelSpec, cache_root
from tests.helpers import random_prompt, run_method

VOCAB = 96
PROMPT = 24  # prompt tokens of each corpus sequence
# A random tiny target's next-token distribution is nearly uniform (mean top-1 probability 0.015 over 96
# tokens); scaling its head ×30 makes it as peaked as a real model's (top-1 ≈ 0.6-0.75), which an objective
# that matches distributions (DART's KL) needs before its drafts agree with the greedy token.
SHARPEN = 30.0
SAMPLING_TEMPERATURE = 0.06 * SHARPEN  # these targets' distributions at it = an unsharpened target's at 0.06


class _Loaded(SimpleNamespace):
    @property
    def cache_dir(self):  # read when used, so a test's SPECBENCH_CACHE applies
        return cache_root()


def loaded(model: torch.nn.Module, name: str = "tiny"):
    """What a method receives as `model` (a LoadedModel's fields that methods read)."""
    return _Loaded(model=model, device=torch.device("cpu"), dtype=torch.float32,
                   spec=ModelSpec(name, name, "tiny test target"), tokenizer=None)


def greedy_corpus(target: torch.nn.Module, n: int = 12, new: int = 120) -> list[list[int]]:
    """Prompt + greedy continuation of n random prompts: the distillation data."""
    from specbench_methods.baseline import Baseline

    seqs = []
    for i in range(n):
        prompt = random_prompt(PROMPT, VOCAB, seed=100 + i)
        out = run_method(target, Baseline(Baseline.Options(), None), prompt, max_new=new).output_ids
        seqs.append(prompt + out)
    return seqs


@torch.no_grad()
def target_pass(target: torch.nn.Module, seq: list[int], layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs of the given decoder layers, concatenated [T, k*H], and the target's greedy next tokens [T]."""
    out = target(torch.tensor([seq]), output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i + 1][0] for i in layers], dim=-1)
    return feats, out.logits[0].argmax(-1)


def distil(method: str, folder: Path, target: torch.nn.Module, corpus: list[list[int]] | None, steps: int,
           seed: int = 0, settings: dict | None = None, **shape) -> Path:
    """`method`'s training recipe around a draft of `shape` (its config fields), trained `steps` steps on the
    corpus held in memory (random when there is no corpus or no steps) and written to `folder` by the trainer."""
    from specbench_cli.registry import recipe_class
    from specbench_cli.commands.train.distill import Corpus
    from specbench_cli.commands.train.train import TrainSettings, train

    torch.manual_seed(seed)
    sequences = corpus or [[0, 1]]
    recipe_cls = recipe_class(method)
    data = Corpus.in_memory(target, sequences, [min(PROMPT, len(seq) - 1) for seq in sequences],
                            list(range(target.config.num_hidden_layers)), topk=16 if recipe_cls.needs_topk else 0)
    s = TrainSettings(method=method, steps=steps if corpus else 0, lr=3e-3, warmup=1, holdout=0,
                      eval_every=max(steps, 1), seed=seed, intermediate=128, **(settings or {}))
    train(target, data, folder, s, "tests/drafter_fixtures.py", recipe=recipe_cls(target, data, s, **shape))
    return folder


def write_eagle3(folder: Path, target: torch.nn.Module, corpus: list[list[int]] | None = None, steps: int = 300,
                 seed: int = 0, draft_vocab: int = VOCAB, layout: str = "flat", head_dim: int = 24,
                 qk_norm: bool = False, norm_before_residual: bool = False) -> Path:
    """A random or distilled EAGLE-3 checkpoint in the flat or speculators layout. head_dim 24 × 4 heads ≠
    hidden 64: the Qwen3-4B quirk. Distilled with the first training-time-test step only (a few CPU seconds)."""
    return distil("eagle3", folder, target, corpus, steps, seed, {"ttt": 3, "draft_vocab": draft_vocab},
                  head_dim=head_dim, qk_norm=qk_norm, norm_before_residual=norm_before_residual,
                  layer_prefix="layers.0." if layout == "speculators" else "midlayer.")


def write_dflash(folder: Path, target: torch.nn.Module, corpus: list[list[int]] | None = None, steps: int = 300,
                 block_size: int = 8, seed: int = 0) -> Path:
    """A 2-layer DFlash drafter over target layers (1, 2, 3) with mask token VOCAB-1, random or distilled."""
    return distil("dflash", folder, target, corpus, steps, seed, {"draft_layers": 2, "block_size": block_size},
                  capture=[1, 2, 3], mask_token_id=VOCAB - 1)


def write_dart(folder: Path, target: torch.nn.Module, corpus: list[list[int]] | None = None, steps: int = 300,
               draft_length: int = 4, seed: int = 0) -> Path:
    """A DART checkpoint (EAGLE-3 flat layout + midlayer.mask_rep + draft_length) and the corpus' small.trie."""
    return distil("dart", folder, target, corpus, steps, seed, {"slots": draft_length}, head_dim=24)


def write_confu(folder: Path, target: torch.nn.Module, corpus: list[list[int]] | None = None, steps: int = 300,
                scale: float | None = None, seed: int = 0) -> Path:
    """Our ConFu format (an EAGLE-3 flat checkpoint plus the ConFu parts), random or distilled; `scale` redraws
    the parts at that standard deviation (large parts make the future token change the drafts)."""
    distil("confu", folder, target, corpus, steps, seed, {"ttt": 3}, head_dim=24)
    if scale is not None:
        generator = torch.Generator().manual_seed(seed)

        def redraw(tensors: dict[str, torch.Tensor]) -> None:
            for name, t in tensors.items():
                if name.startswith("confu.") and t.is_floating_point():
                    tensors[name] = (torch.randn(t.shape, generator=generator) * scale).to(t.dtype)

        edit_checkpoint(folder, tensors=redraw)
    return folder


# ---------------------------------------------------------------------------------------------- shared cache
# method -> (writer, distillation arguments). Steps were chosen so each drafter accepts most tokens of a
# prompt from its corpus within a few CPU seconds.
WRITERS = {
    "eagle3": (write_eagle3, {"steps": 400, "draft_vocab": 64}),
    "dflash": (write_dflash, {"steps": 300}),
    "dart": (write_dart, {"steps": 300}),
    "confu": (write_confu, {"steps": 300}),
}


class Distilled:
    """Tiny 6-layer targets, their greedy corpora and distilled drafters, each made once per test session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.targets: dict[str, tuple[torch.nn.Module, list[list[int]]]] = {}
        self.folders: dict[tuple[str, str], Path] = {}

    def target(self, arch: str) -> tuple[torch.nn.Module, list[list[int]]]:
        if arch not in self.targets:
            from tests.conftest import tiny_model

            model = tiny_model(arch, layers=6)
            with torch.no_grad():  # see SHARPEN
                model.lm_head.weight.mul_(SHARPEN)
            self.targets[arch] = (model, greedy_corpus(model, n=4, new=150))
        return self.targets[arch]

    def __call__(self, method: str, arch: str) -> tuple[torch.nn.Module, list[list[int]], Path]:
        target, corpus = self.target(arch)
        if (method, arch) not in self.folders:
            writer, kwargs = WRITERS[method]
            self.folders[method, arch] = writer(self.root / f"{method}-{arch}", target, corpus, **kwargs)
        return target, corpus, self.folders[method, arch]


def make_method(name: str, target: torch.nn.Module, folder: Path, **opts):
    """The registered method `name` on a tiny target, reading its drafter from `folder`."""
    from specbench_cli.registry import method_class

    cls = method_class(name)
    drafters = {name: str(folder), **({"dart_ngram": str(folder)} if name == "dart" else {})}
    return cls(cls.Options(**opts), loaded(target), drafters)


def edit_checkpoint(folder: Path, tensors=None, config=None) -> Path:
    """Apply in-place edits to a checkpoint's tensors and/or config.json (to build broken checkpoints)."""
    import json

    from safetensors.torch import load_file, save_file

    if tensors:
        data = load_file(folder / "model.safetensors")
        tensors(data)
        save_file(data, folder / "model.safetensors")
    if config:
        data = json.loads((folder / "config.json").read_text())
        config(data)
        (folder / "config.json").write_text(json.dumps(data))
    return folder
