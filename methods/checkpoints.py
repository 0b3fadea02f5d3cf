"""Drafter checkpoints: find them (local folder or Hugging Face id), read config.json and the tensors, and
check every tensor's name and shape so that a wrong file fails with one line naming the file and the key.

Released drafters ship as safetensors (single or sharded with an index) or as `pytorch_model.bin`
(yuhuili's EAGLE-3 repos). Weights are read with our own modules; remote code is never executed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from specbench_cli.core.errors import UsageError
from specbench_cli.core.dtypes import dtype_name

WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.bin", "*.txt"]


class CheckpointError(UsageError):
    """A checkpoint that does not match the format its method reads."""


def hub_ref(ref: str) -> tuple[str, str | None]:
    """("org/name", revision) of a hub reference "org/name" or "org/name@REVISION" (a commit, branch or tag)."""
    repo, _, revision = ref.partition("@")
    return repo, revision or None


def locate(ref: str, what: str, patterns: list[str] | None = None) -> Path:
    """A local folder as is; a hub id ("org/name", or "org/name@REVISION" at one revision) is downloaded, or found
    in the cache when HF_HUB_OFFLINE=1, and its snapshot folder (named by the commit) returned."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    repo, revision = hub_ref(ref)
    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=patterns or WEIGHT_PATTERNS))
    except Exception as err:  # offline miss, gated repo, unknown revision, network error: one line for the user
        raise UsageError(f"cannot fetch {what} checkpoint '{ref}': {hub_problem(err)}") from None


def locate_file(ref: str, filename: str, what: str) -> Path:
    """One file of a hub repo (e.g. DART's `small.trie`), or `ref` itself when it is a local file or folder."""
    path = Path(ref).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        return path / filename
    from huggingface_hub import hf_hub_download

    repo, revision = hub_ref(ref)
    try:
        return Path(hf_hub_download(repo, filename, revision=revision))
    except Exception as err:
        raise UsageError(f"cannot fetch {what} '{ref}/{filename}': {hub_problem(err)}") from None


def hub_problem(err: Exception) -> str:
    """What went wrong fetching from the hub, in words a user can act on (huggingface_hub's own first line
    otherwise): a repo missing from the offline cache, a gated repo without a token, an unknown revision."""
    name = type(err).__name__
    if name == "GatedRepoError":
        return "the repo is gated: accept its licence on the hub, then log in (hf auth login) or set HF_TOKEN"
    if name == "RevisionNotFoundError":
        return "no such revision in the repo"
    if name == "RepositoryNotFoundError":
        return "no such repo on the hub (or it is private: log in or set HF_TOKEN)"
    if name in ("LocalEntryNotFoundError", "OfflineModeIsEnabled") or "offline" in str(err).lower():
        return "not in the local hub cache and HF_HUB_OFFLINE=1 (download it once with network, or unset it)"
    return _first_line(err)


# What a drafter drafts with: its tensors, wherever they lie in the folder (FlashHead's clusters sit in a
# subfolder of the SpS model), and DART's n-gram trie, which reweights its candidates.
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.trie")


def fingerprint(folder: Path, also: tuple[str, ...] = ()) -> str:
    """A short hash of a checkpoint folder's weight files (and the files matching `also`, e.g. a calibration's
    config.json, whose thresholds decide as much as its weights), or of one file (a DART trie passed alone).
    Calibration cards record the drafters they were measured with by it, so that a run can tell when a drafter
    has changed under its calibration."""
    root = folder.parent if folder.is_file() else folder
    files = [folder] if folder.is_file() else sorted(
        {p for pattern in (*WEIGHT_FILES, *also) for p in folder.rglob(pattern) if p.is_file()})
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.relative_to(root).as_posix().encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def weights_id(ref: str, also: tuple[str, ...] = ()) -> str:
    """Which weights a drafter reference names: a local folder's or file's `fingerprint`, or a hub id with the
    commit it resolves to ("org/name@<commit>"), since a hub repo's main branch moves. Resolving the commit
    fetches only the repo's config.json (or finds it in the cache offline), so an unreachable drafter fails here,
    in one line, before the target loads."""
    path = Path(ref).expanduser()
    if path.exists():
        return fingerprint(path, also)
    return f"{hub_ref(ref)[0]}@{locate(ref, 'drafter', ['config.json']).name}"  # the cache's snapshots/<commit> folder


def stale_drafters(card: dict, refs: dict[str, str]) -> list[str]:
    """Drafters in `refs` (name -> checkpoint) whose weights differ from those `card["drafters"]` was made
    with. Cards written before fingerprints were recorded name none, and nothing is reported for them."""
    made = card.get("drafters") or {}
    return [name for name, ref in refs.items() if name in made and fingerprint(locate(ref, name)) != made[name]]


def timed_as(dtype: torch.dtype, device: torch.device) -> str:
    """"bfloat16 on cpu": what a calibration's latencies depend on beside the drafters (its `latency_dtype`)."""
    return f"{dtype_name(dtype)} on {device.type}"


def warn_if_stale(card: dict, refs: dict[str, str], what: str, model: str, timed_as: str) -> None:
    """One warning line when a calibration was measured with other drafters than this run loads, or its
    latencies timed in another dtype or on another device than this run's (`timed_as`, e.g. "bfloat16 on
    cpu"): its thresholds and predictions describe those costs, not these (the run itself stays lossless).
    A card written before `latency_dtype` was recorded is not judged on it."""
    stale = stale_drafters(card, refs)
    again = f"re-run `specbench calibrate --method {what} --model {model}` for one that fits"
    if stale:
        print(f"warning: {what} was calibrated with another {' and '.join(stale)} drafter than this run loads; {again}",
              file=sys.stderr)
    if card.get("latency_dtype", timed_as) != timed_as:
        print(f"warning: {what}'s latencies were timed in {card['latency_dtype']}, this run is {timed_as}; {again}",
              file=sys.stderr)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


@dataclass
class Checkpoint:
    """config.json plus every tensor of a checkpoint folder, with checked access."""

    folder: Path
    config: dict
    tensors: dict[str, torch.Tensor]
    files: dict[str, str] = field(default_factory=dict)  # key -> file it came from (for error messages)
    used: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, ref: str, what: str) -> Checkpoint:
        folder = locate(ref, what)
        config_file = folder / "config.json"
        if not config_file.exists():
            raise CheckpointError(f"{what} checkpoint {folder} has no config.json")
        try:
            config = json.loads(config_file.read_text())
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{config_file}: not valid JSON ({err})") from None
        tensors, files = read_tensors(folder)
        return cls(folder, config, tensors, files)

    def has(self, key: str) -> bool:
        return key in self.tensors

    def take(self, key: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """The tensor `key`, checked against `shape` (None entries match anything)."""
        if key not in self.tensors:
            raise CheckpointError(f"{self.folder}: missing tensor '{key}'")
        t = self.tensors[key]
        self.used.add(key)
        if shape is not None and (len(shape) != t.dim() or any(s is not None and s != d for s, d in zip(shape, t.shape))):
            want = "×".join("?" if s is None else str(s) for s in shape)
            raise CheckpointError(f"{self.files.get(key, self.folder)}: tensor '{key}' has shape "
                                  f"{'×'.join(map(str, t.shape))}, expected {want}")
        return t

    def load_into(self, module: torch.nn.Module, rename: Callable[[str], str] = lambda name: name) -> None:
        """Fill every parameter and buffer of `module` from the checkpoint key `rename(name)`, shape-checked."""
        with torch.no_grad():
            for name, value in module.state_dict().items():
                value.copy_(self.take(rename(name), tuple(value.shape)))

    def reject_unused(self, ignore: tuple[str, ...] = ()) -> None:
        """A tensor nobody read means a layout variant we do not implement: fail instead of drafting wrong.
        `ignore` holds names or name prefixes that may stay unread."""
        extra = sorted(k for k in self.tensors if k not in self.used and not k.startswith(ignore))
        if extra:
            more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
            raise CheckpointError(f"{self.files.get(extra[0], self.folder)}: unexpected tensor '{extra[0]}'{more}; "
                                  "this checkpoint layout is not supported")

    def need(self, key: str, kind: type = int):
        """A required config.json entry."""
        if key not in self.config:
            raise CheckpointError(f"{self.folder / 'config.json'}: missing key '{key}'")
        try:
            return kind(self.config[key])
        except (TypeError, ValueError):
            raise CheckpointError(f"{self.folder / 'config.json'}: key '{key}' = {self.config[key]!r} "
                                  f"is not a {kind.__name__}") from None


def read_tensors(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors or pytorch_model.bin weights")
    tensors: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    for f in files:
        if f.suffix == ".safetensors":
            from safetensors.torch import load_file

            part = load_file(str(f))
        else:
            part = torch.load(f, map_location="cpu", weights_only=True)
        tensors.update(part)
        origin.update(dict.fromkeys(part, str(f)))
    return tensors, origin


def save(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    """Write a checkpoint folder (config.json + model.safetensors): used by tests and the trainer."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
