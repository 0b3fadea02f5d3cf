"""Tiny drafter checkpoints in each released format, random or distilled on the spot to a tiny target.

Random drafters check loading; distilled ones accept often, so the lossless tests exercise long accepted
paths through trees and chains. Distillation here is the plainest version of each objective (one step,
cross-entropy to the target's greedy next token) and takes a few seconds on CPU.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from methods.checkpoints import save
from methods.dflash import DFlashConfig, DFlashDraft
from methods.eagle3 import Eagle3Config, Eagle3Draft, default_capture
from methods.layers import causal_mask
from specbench_cli.models import ModelSpec, cache_root
from tests.helpers import random_prompt, run_method

VOCAB = 96


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
    from methods.baseline import Baseline

    seqs = []
    for i in range(n):
        prompt = random_prompt(24, VOCAB, seed=100 + i)
        out = run_method(target, Baseline(Baseline.Options(), None), prompt, max_new=new).output_ids
        seqs.append(prompt + out)
    return seqs


@torch.no_grad()
def target_pass(target: torch.nn.Module, seq: list[int], layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs of the given decoder layers, concatenated [T, k*H], and the target's greedy next tokens [T]."""
    out = target(torch.tensor([seq]), output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i + 1][0] for i in layers], dim=-1)
    return feats, out.logits[0].argmax(-1)


def train(draft: torch.nn.Module, target: torch.nn.Module, steps: int, loss) -> None:
    """AdamW on the draft's parameters (the target stays frozen); `loss(step)` builds each step's loss."""
    target.requires_grad_(False)
    opt = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    for step in range(steps):
        value = loss(step)
        opt.zero_grad()
        value.backward()
        opt.step()
    draft.eval()


def eagle3_config(target: torch.nn.Module, *, draft_vocab: int = VOCAB, layout: str = "flat",
                  head_dim: int = 24, qk_norm: bool = False, norm_before_residual: bool = False) -> Eagle3Config:
    """A one-layer draft for the tiny target. head_dim 24 × 4 heads ≠ hidden 64: the Qwen3-4B quirk."""
    L, H = target.config.num_hidden_layers, target.config.hidden_size
    return Eagle3Config(hidden=H, target_hidden=H, heads=4, kv_heads=2, head_dim=head_dim, intermediate=128,
                        eps=1e-6, rope_theta=10000.0, rope_scaling=None, draft_vocab=draft_vocab,
                        vocab=target.config.vocab_size,
                        capture=default_capture(L), norm_before_residual=norm_before_residual, qk_norm=qk_norm,
                        layer_prefix="layers.0." if layout == "speculators" else "midlayer.", own_embedding=False)


def write_eagle3(folder: Path, target: torch.nn.Module, corpus: list[list[int]] | None = None,
                 steps: int = 300, seed: int = 0, **config) -> Path:
    """A random (corpus None) or distilled EAGLE-3 checkpoint in the flat or speculators layout."""
    torch.manual_seed(seed)
    c = eagle3_config(target, **config)
    draft = Eagle3Draft(c, target.get_input_embeddings().weight.detach())
    draft.choose_vocab(corpus or [[0]])
    if corpus:
        distill_eagle3(draft, target, corpus, steps)
    save(folder, *draft.export())
    return folder


def distill_eagle3(draft: Eagle3Draft, target: torch.nn.Module, corpus: list[list[int]], steps: int) -> None:
    """Feature t with token t+1 -> the target's greedy token after t+1 (EAGLE-3's first TTT step)."""
    c, to_draft = draft.config, draft.to_draft()
    data = []
    for seq in corpus:
        feats, nxt = target_pass(target, seq, c.capture)
        data.append((feats[:-1], torch.tensor(seq[1:]), to_draft[nxt[1:]]))

    def loss(step: int) -> torch.Tensor:
        feats, ids, labels = data[step % len(data)]
        n = ids.shape[0]
        out, _ = draft.step(feats, ids, torch.arange(n), mask=causal_mask(n, 0, feats.device))
        return torch.nn.functional.cross_entropy(draft.logits(out), labels, ignore_index=-100)

    train(draft, target, steps, loss)


def write_dflash(folder: Path, target: torch.nn.Module, corpus: list[list[int]] | None = None, steps: int = 300,
                 block_size: int = 8, seed: int = 0) -> Path:
    """A 2-layer DFlash drafter over target layers (1, 2, 3) with mask token VOCAB-1, random or distilled."""
    torch.manual_seed(seed)
    H = target.config.hidden_size
    c = DFlashConfig(hidden=H, heads=4, kv_heads=2, head_dim=16, intermediate=128, layers=2, eps=1e-6,
                     rope_theta=10000.0, rope_scaling=None, capture=[1, 2, 3], block_size=block_size,
                     mask_token_id=VOCAB - 1)
    draft = DFlashDraft(c, target)
    if corpus:
        distill_dflash(draft, target, corpus, steps)
    save(folder, *draft.export(target.config.num_hidden_layers))
    return folder


def distill_dflash(draft: DFlashDraft, target: torch.nn.Module, corpus: list[list[int]], steps: int,
                   prompt_len: int = 24) -> None:
    """Block training: context = features before an anchor s, block = [token s, masks]; labels = tokens s+1..."""
    c = draft.config
    data = [(target_pass(target, seq, c.capture)[0], torch.tensor(seq)) for seq in corpus]
    gen = torch.Generator().manual_seed(0)

    def loss(step: int) -> torch.Tensor:
        feats, seq = data[step % len(data)]
        s = int(torch.randint(prompt_len, seq.shape[0] - c.block_size, (1,), generator=gen))
        block = torch.full((c.block_size,), c.mask_token_id)
        block[0] = seq[s]
        hidden, _ = draft(feats[:s], 0, block, s)
        return torch.nn.functional.cross_entropy(draft.logits(hidden[1:]), seq[s + 1: s + c.block_size])

    train(draft, target, steps, loss)


def write_dart(folder: Path, target: torch.nn.Module, corpus: list[list[int]] | None = None, steps: int = 300,
               draft_length: int = 4, seed: int = 0) -> Path:
    """A DART checkpoint (EAGLE-3 flat layout + midlayer.mask_rep + draft_length) and a .trie of the corpus."""
    from methods.dart import DartDraft
    from methods.ngram import Trie

    torch.manual_seed(seed)
    c = eagle3_config(target)
    c.mask_slots = draft_length
    draft = DartDraft(c, target.get_input_embeddings().weight.detach())
    with torch.no_grad():
        draft.midlayer.mask_rep.normal_(0, 1)
    if corpus:
        distill_dart(draft, target, corpus, steps)
        (folder / "ngram").mkdir(parents=True, exist_ok=True)
        Trie.build([seq + [VOCAB - 1] for seq in corpus]).save(folder / "ngram" / "small.trie")
    save(folder, *draft.export())
    return folder


def distill_dart(draft: Eagle3Draft, target: torch.nn.Module, corpus: list[list[int]], steps: int,
                 prompt_len: int = 24, gamma: float = 0.6) -> None:
    """Context up to a random cut n; the last real position and the D slots predict tokens n+1 ... n+D+1,
    weighted gamma^level (the DART seed's annealed weights, here on cross-entropy)."""
    c = draft.config
    D = c.mask_slots
    data = [(target_pass(target, seq, c.capture)[0], torch.tensor(seq)) for seq in corpus]
    weights = gamma ** torch.arange(D + 1, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)

    def loss(step: int) -> torch.Tensor:
        feats, seq = data[step % len(data)]
        n = int(torch.randint(prompt_len, seq.shape[0] - D - 1, (1,), generator=gen))
        out, _ = draft.step(feats[:n], seq[1:n + 1], torch.arange(n + D), mask=causal_mask(n + D, 0, feats.device))
        losses = torch.nn.functional.cross_entropy(draft.logits(draft.norm(out)), seq[n + 1: n + D + 2], reduction="none")
        return (losses * weights).sum() / weights.sum()

    train(draft, target, steps, loss)


def write_confu(folder: Path, target: torch.nn.Module, corpus: list[list[int]] | None = None, steps: int = 300,
                scale: float = 0.02, seed: int = 0) -> Path:
    """Our ConFu format: an EAGLE-3 flat checkpoint (distilled when a corpus is given) plus random ConFu parts."""
    from methods.confu import ConFuConfig, new_parts

    torch.manual_seed(seed)
    c = eagle3_config(target)
    draft = Eagle3Draft(c, target.get_input_embeddings().weight.detach())
    if corpus:
        distill_eagle3(draft, target, corpus, steps)
    config, tensors = draft.export()
    parts = new_parts(target, draft, ConFuConfig(soft_prompt_tokens=4, experts=4, top_experts=2), scale)
    config["confu"] = {"soft_prompt_tokens": 4, "experts": 4, "top_experts": 2}
    save(folder, config, {**tensors, **parts.export()})
    return folder


# ---------------------------------------------------------------------------------------------- shared cache
# method -> (writer, distillation arguments). Steps were chosen so each drafter accepts most tokens of a
# prompt from its corpus within a few CPU seconds.
WRITERS = {
    "eagle3": (write_eagle3, {"steps": 400, "draft_vocab": 64}),
    "dflash": (write_dflash, {"steps": 600}),
    "dart": (write_dart, {"steps": 500}),
    "confu": (write_confu, {"steps": 400}),
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
    trie = folder / "ngram" if (folder / "ngram").is_dir() else folder  # the fixtures' layout, or the trainer's
    drafters = {name: str(folder), **({"dart_ngram": str(trie)} if name == "dart" else {})}
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
