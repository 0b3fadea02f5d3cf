"""train-drafter's checks that need no torch: the folder it writes, the checkpoint it starts from."""

from __future__ import annotations

from pathlib import Path

from specbench_cli.core.errors import UsageError


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
