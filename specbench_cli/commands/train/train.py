"""`specbench train-drafter`: train a drafter on a self-distillation corpus and write it in its loader's format.

The objectives live in `specbench_cli/commands/train/recipes/` (one module per method); this module is the loop they share:
a seeded held-out split of the corpus, AdamW with a linear warm-up (and optionally a cosine anneal at the end)
and gradient clipping, held-out top-1 accuracy per draft position every `eval_every` steps, a resumable state
file, and a JSON card with the data, steps, wall time, accuracies and the exact command(s).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from specbench_cli.folders import write_atomically
from specbench_cli.commands.train.distill import Corpus
from specbench_cli.commands.train.inputs import TrainSettings
from specbench_cli.core.errors import UsageError
from specbench_cli.registry import recipe_class
from specbench_cli.commands.train.recipes import Recipe, Sample


def trained_span(length: int, max_len: int) -> slice:
    """The tokens a sequence trains on: all, or a longer one's last `max_len`: its whole answer (a corpus
    answers in at most 160 tokens) and the end of its prompt. Keeping the first tokens instead would leave a
    long prompt (a passage to summarise) with no answer to learn from. The features were computed over the
    whole sequence, so they still carry the context the window leaves out."""
    return slice(max(length - max_len, 0), length)


def train(target: torch.nn.Module, corpus: Corpus, out: Path, s: TrainSettings, command: str, progress=None,
          resume: bool = False, recipe: Recipe | None = None) -> dict:
    """Train `s.method`'s recipe (or `recipe`, built by the caller around a draft of another shape) and
    publish the drafter in `out`. Training runs on the target's device: recipes build their drafts with it as
    the default device (set here), and their losses make every tensor on the samples' device."""
    device = next(target.parameters()).device
    with torch.device(device):
        return _train(target, corpus, out, s, command, progress, resume, recipe, device)


def _train(target: torch.nn.Module, corpus: Corpus, out: Path, s: TrainSettings, command: str, progress,
           resume: bool, recipe: Recipe | None, device: torch.device) -> dict:
    torch.manual_seed(s.seed)
    target.requires_grad_(False)
    state_file, step, history, spent, earlier = out / "train_state.pt", 0, [], 0.0, []
    state = torch.load(state_file, weights_only=False, map_location=device) if resume and state_file.exists() else None
    if state is not None and "init" in state:  # a resumed run is rebuilt on the checkpoint it started from
        s = replace(s, init=state["init"])
    start = init_card(s)
    sizes = corpus_sizes(state, out, len(corpus.sequences), trained_blocks(start, corpus, s))
    # The draft's corpus-derived choices (EAGLE-3's vocabulary, DFlash's mask token) come from the corpus the
    # run began on, so that a state saved before the corpus grew still means what it meant.
    recipe = recipe or recipe_class(s.method)(target, corpus.first(sizes[0]), s)
    draft = recipe.model
    if recipe.needs_topk and not corpus.has_topk:
        raise UsageError(f"corpus {corpus.where} has no top-k target distributions; build them with cache_topk")
    held, train_ids = split(sizes, s)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=s.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k, s))
    if state is not None:
        draft.load_state_dict(state["draft"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step, history, spent = state["step"], state["history"], state["seconds"]
        earlier = state.get("commands", [])  # the sessions that trained it so far (a resumed run has several)
        _schedule_from(s, opt, sched, step)

    def sample(i: int) -> Sample:
        cut = trained_span(len(corpus.sequences[i]), s.max_len)
        seq = corpus.sequences[i][cut]
        feats = corpus.feats(i, recipe.layers)[cut] if recipe.layers else torch.empty(len(seq), 0)
        topk = [x[cut].to(device) for x in corpus.topk(i)] if recipe.needs_topk else (None, None)
        return Sample(torch.tensor(seq, device=device), corpus.next(i)[cut].to(device), feats.to(device),
                      max(corpus.prompt_lens[i] - cut.start, 0), *topk)

    if s.init and state is None:  # the checkpoint scored on this run's held-out set: the mark to beat
        history.append({"step": 0, "loss": None, "heldout_top1": evaluate_apart(recipe, [sample(i) for i in held],
                                                                                 s.seed)})
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    window: list[float] = []  # training losses since the last evaluation
    while step < s.steps:
        draft.train()
        loss, _ = recipe.loss(sample(train_ids[step % len(train_ids)]))
        window.append(float(loss.detach()))
        opt.zero_grad()
        if loss.requires_grad:  # a sequence too short to give any label leaves nothing to learn
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            opt.step()
        sched.step()
        step += 1
        if step % s.eval_every == 0 or step == s.steps:
            acc = evaluate(recipe, [sample(i) for i in held])
            history.append({"step": step, "loss": round(sum(window) / len(window), 5), "heldout_top1": acc})
            window = []
            save_state({"draft": draft.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "step": step,
                        "history": history, "seconds": spent + time.perf_counter() - t0, "commands": [*earlier, command],
                        "corpus_sizes": sizes, "init": s.init}, state_file)
            if s.minutes and time.perf_counter() - t0 >= 60 * s.minutes:  # this session's minutes, not the run's
                break
        if progress is not None:
            progress(step, float(loss.detach()), history[-1]["heldout_top1"] if history else None)
    seconds = spent + time.perf_counter() - t0
    draft.eval()
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".export-"))
    recipe.export(staging)
    card = {"method": s.method, "settings": asdict(s), "command": command, "earlier_commands": earlier,
            "data": {"corpus": corpus.where, "sequences": len(corpus.sequences), "tokens": corpus.tokens,
                     "train_sequences": len(train_ids), "heldout_sequences": len(held),
                     **({"grown_from": sizes[:-1]} if len(sizes) > 1 else {})},
            **({"init": {"from": s.init, "steps": start.get("steps"), "commands": commands_of(start),
                         "heldout_top1_per_position": start.get("heldout_top1_per_position")}} if s.init else {}),
            "steps": step, "wall_seconds": round(seconds, 1), "heldout_top1_per_position": history[-1]["heldout_top1"] if history else None,
            "history": history, "dtype": "float16"}
    (staging / "card.json").write_text(json.dumps(card, indent=2))
    publish(staging, out)
    return card


def save_state(state: dict, path: Path) -> None:
    """Written beside the old state and renamed over it: a run killed while saving keeps a state to resume."""
    write_atomically(path, lambda tmp: torch.save(state, tmp))


def corpus_sizes(state: dict | None, out: Path, now: int, init: list[int]) -> list[int]:
    """The corpus sizes a run has trained on, ending with `now`: a resumed run's saved list (or, for a state
    saved before the list was kept, the size its card in `out` reports), grown by `now` if the corpus grew.
    A new run that starts from a checkpoint trained on this corpus begins with that checkpoint's sizes
    (`init`, from `trained_blocks`), so the sequences it held out stay held out."""
    if state is not None:
        card = out / "card.json"
        before = state.get("corpus_sizes") or [json.loads(card.read_text())["data"]["sequences"] if card.exists() else now]
        what = "--resume: this run"
    elif init:
        before, what = init, "--init: the checkpoint"
    else:
        return [now]
    if now < before[-1]:
        raise UsageError(f"{what} trained on {before[-1]} corpus sequences and the corpus now gives "
                         f"{now}; pass --prompts {before[-1]} or more")
    return before if now == before[-1] else [*before, now]


def init_card(s: TrainSettings) -> dict:
    """The card of the checkpoint a run starts from (`s.init`), {} when there is none (a hub checkpoint)."""
    card = Path(s.init).expanduser() / "card.json" if s.init else None
    return json.loads(card.read_text()) if card is not None and card.is_file() else {}


def commands_of(card: dict) -> list[str]:
    """Every session's command that trained the drafter a card describes, first to last: those that made the
    checkpoint it started from (--init), then its own sessions."""
    own = [*card.get("earlier_commands", []), *([card["command"]] if "command" in card else [])]
    return [*(card.get("init") or {}).get("commands", []), *own]


def trained_blocks(start: dict, corpus: Corpus, s: TrainSettings) -> list[int]:
    """The corpus sizes the starting checkpoint (its card `start`) trained on, when it trained on this very
    corpus folder ([] otherwise). Its held-out split can then be kept, which takes the same --seed."""
    data = start.get("data") or {}
    if corpus.folder is None or "corpus" not in data or Path(data["corpus"]).resolve() != corpus.folder.resolve():
        return []
    if start["settings"]["seed"] != s.seed:
        raise UsageError(f"--init {s.init} was trained on this corpus with --seed {start['settings']['seed']}; "
                         f"pass the same seed so that the sequences it held out stay held out")
    return [*data.get("grown_from", []), data["sequences"]]


def split(sizes: list[int], s: TrainSettings) -> tuple[list[int], list[int]]:
    """Held-out and training sequence ids: a seeded share of the corpus is held out. The sequences a corpus
    gained while a run trained (each block between two of `sizes`) are split on their own, so no sequence the
    run has trained on is ever moved into its held-out set."""
    held, train_ids = [], []
    for start, end in zip([0, *sizes], sizes):
        order = list(range(start, end))
        random.Random(s.seed).shuffle(order)
        n_hold = min(max(1, int(len(order) * s.holdout)), s.holdout_max) if s.holdout > 0 else 0
        held, train_ids = held + order[:n_hold], train_ids + order[n_hold:]
    if len(sizes) > 1:  # old and new sequences mixed, not one block after the other
        random.Random(s.seed).shuffle(train_ids)
    return held, train_ids


def _schedule_from(s: TrainSettings, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LambdaLR,
                   step: int) -> None:
    """Make a resumed run follow this session's `--lr` and schedule from `step` on. The saved scheduler state
    carries the first session's peak rate and the optimiser the last rate it used (0 at the end of an anneal),
    so without this a changed `--lr` would be ignored and the first resumed step would take the old rate."""
    sched.base_lrs = [s.lr] * len(opt.param_groups)
    for group in opt.param_groups:
        group["initial_lr"], group["lr"] = s.lr, s.lr * lr_factor(step, s)


def lr_factor(step: int, s: TrainSettings) -> float:
    """The learning rate at `step` as a share of `s.lr`: a linear warm-up, then constant, then over the last
    `s.anneal` steps a half cosine down to 0. `anneal = steps − warmup` is SpecForge's schedule (linear
    warm-up, cosine to 0: `CosineAnnealingWarmupLR` in its train_eagle3.py); a short anneal after a constant
    phase lets a run be continued (`--resume` with more `--steps`) and still end annealed."""
    warm = min(1.0, (step + 1) / max(1, s.warmup))
    into = step - (s.steps - s.anneal)
    if s.anneal <= 0 or into < 0:
        return warm
    return warm * 0.5 * (1 + math.cos(math.pi * min(into, s.anneal) / s.anneal))


def publish(staging: Path, out: Path) -> None:
    """Move an exported drafter into `out` so that no loader ever sees half of one: loaders look for
    config.json, which goes first out of the folder and last into it."""
    (out / "config.json").unlink(missing_ok=True)
    files = sorted(staging.iterdir(), key=lambda f: f.name == "config.json")
    for f in files:
        if (out / f.name).is_dir():
            shutil.rmtree(out / f.name)  # a folder of assets is replaced whole
        os.replace(f, out / f.name)
    staging.rmdir()


@torch.no_grad()
def evaluate(recipe: Recipe, samples: list[Sample]) -> list[float]:
    recipe.model.eval()
    correct, counted = [0] * recipe.positions, [0] * recipe.positions
    for sample in samples:
        _, stats = recipe.loss(sample)
        for j, (a, b) in enumerate(stats):
            correct[j] += a
            counted[j] += b
    return [round(a / b, 4) if b else float("nan") for a, b in zip(correct, counted)]


def evaluate_apart(recipe: Recipe, samples: list[Sample], seed: int) -> list[float]:
    """`evaluate` without drawing from the global generator (its anchors come from `seed`), so that a run
    trains on the same anchors whether or not it was scored first."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return evaluate(recipe, samples)


def command_line() -> str:
    return " ".join(["specbench", *sys.argv[1:]])
