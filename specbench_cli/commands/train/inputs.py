"""train-drafter's settings and the checks that need no torch: the recipe's settings (`--opt METHOD.key=value`),
the folder it writes, the checkpoint it starts from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specbench_cli.core.errors import UsageError
from specbench_cli.options import parse_into


@dataclass
class TrainSettings:
    method: str = "eagle3"
    steps: int = 2000
    lr: float = 1e-3
    warmup: int = 100
    anneal: int = 0  # last steps over which the learning rate falls to 0 (half cosine); 0: constant after warm-up
    max_len: int = 384  # tokens per training sequence (longer ones keep their last: see `trained_span`)
    holdout: float = 0.05  # share of sequences held out for evaluation (0: none, nothing evaluated) ...
    holdout_max: int = 256  # ... but at most this many (enough labels; a large corpus need not hold out more)
    eval_every: int = 200
    seed: int = 0
    minutes: float = 0.0  # stop at the first evaluation after this much training time (0: run all `steps`)
    # draft shapes (recipes ignore what does not apply to them)
    draft_vocab: int = 4096  # eagle3, dart: most frequent corpus tokens
    intermediate: int = 1024  # eagle3, dart, dflash: draft MLP width
    draft_layers: int = 0  # dflash: draft decoder layers; sps: target layers kept; 0 = the recipe's default
    # objectives
    ttt: int = 3  # eagle3 training-time-test steps (EAGLE-3 trains with 7; scaled down for CPU)
    block_size: int = 8  # dflash block
    anchors: int = 64  # dflash, dart, confu: anchor positions sampled per sequence
    slots: int = 4  # dart draft_length (mask slots)
    gamma: float = 0.6  # dart: KL weight of level l is gamma^l (the DART seed's Table 4)
    init: str = ""  # checkpoint the draft starts from ("" = from scratch; confu reads an EAGLE-3)
    # ranges of every number (options.check_ranges); RECIPE: the settings `--opt METHOD.key=value` sets
    RANGES = {"steps": (0, None), "lr": (0, None), "warmup": (0, None), "anneal": (0, None), "max_len": (1, None),
              "holdout": (0, 1), "holdout_max": (0, None), "eval_every": (1, None), "seed": (None, None),
              "minutes": (0, None), "draft_vocab": (1, None), "intermediate": (1, None), "draft_layers": (0, None),
              "ttt": (1, None), "block_size": (2, None), "anchors": (1, None), "slots": (1, None), "gamma": (0, None)}
    RECIPE = ("ttt", "draft_vocab", "intermediate", "draft_layers", "block_size", "anchors", "slots", "gamma")

    def __post_init__(self) -> None:
        if self.anneal > self.steps:
            raise UsageError(f"--anneal must be at most --steps ({self.steps}), got {self.anneal}")
        if not (self.lr > 0 and self.gamma > 0):
            raise UsageError(f"--lr and gamma must be > 0 (got {self.lr:g}, {self.gamma:g})")


def train_settings(base: TrainSettings, opts: list[str]) -> TrainSettings:
    """`base` (the command's flags) with the recipe settings `--opt METHOD.key=value` sets (METHOD: the method
    trained), each checked against `TrainSettings.RANGES`."""
    pairs = []
    for pair in opts:
        head, dot, rest = pair.partition(".")
        if not dot or head != base.method or rest.partition("=")[0].strip().replace("-", "_") not in TrainSettings.RECIPE:
            raise UsageError(f"malformed --opt '{pair}': expected {base.method}.KEY=VALUE with KEY one of "
                             f"{', '.join(TrainSettings.RECIPE)}")
        pairs.append(rest)
    return parse_into(f"{base.method}'s recipe", base, pairs, f"{base.method}.", notes=[])  # nothing nested: no notes


def init_checkpoint(init: str | None, method: str, spec) -> str:
    """The checkpoint a run starts from: --init as given ('none': from scratch); by default ConFu starts
    from the model's registered EAGLE-3 drafter and the others from scratch."""
    if init == "none":
        return ""
    return init or (relative_to_cwd(spec.drafters.get("eagle3", "")) if method == "confu" else "")


def relative_to_cwd(path: str) -> str:
    """`path` relative to the working directory when it lies beneath it, so a card records
    `drafters/<model>/eagle3` rather than one machine's absolute path; a hub id or an outside path as is."""
    cwd = Path.cwd().resolve()
    resolved = Path(path).resolve() if path and Path(path).exists() else None
    if resolved is None or not resolved.is_relative_to(cwd):
        return path
    return str(resolved.relative_to(cwd))


def training_folder(out: Path, resume: bool) -> Path:
    if out.exists() and not resume:
        raise UsageError(f"{out} exists; pass --resume to continue its training or --out for a new folder")
    if resume and not out.is_dir():
        raise UsageError(f"--resume: no training to continue at {out}")
    return out
