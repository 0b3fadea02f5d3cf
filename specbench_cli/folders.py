"""One writer per results folder.

A run takes its folder before anything loads: a fresh run creates it (atomically, so of two runs started
together on one `--out` only one gets it) and a resumed run takes the lock file `.lock` (pid, host, start
time) inside it. A second process is refused in one line naming the owner. A lock left by a process that
died on this host (kill -9, a crash) is stale: the next run says so and takes it over, so `--resume` after
a kill just works. A lock from another host cannot be checked and is never taken over.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from specbench_cli.core.errors import UsageError

LOCK = ".lock"


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Write `path` whole or not at all: `write` fills a hidden file beside it (`.NAME.tmp`, which a resumed run
    clears away), renamed over `path` in one step, so a killed process never leaves half a file where a reader
    or a resume looks."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


@contextmanager
def claim(folder: Path, resume: bool, note: Callable[[str], None] = print) -> Iterator[Path]:
    """Own `folder` for the duration of the block. A folder this call created and that holds nothing when the
    block ends (the model failed to load, bad input found late) is removed, so a retry is not told it exists."""
    created = _create(folder, resume)
    try:
        _lock(folder / LOCK, note)
    except BaseException:
        if created:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        yield folder
    finally:
        (folder / LOCK).unlink(missing_ok=True)
        if created and not any(folder.iterdir()):
            folder.rmdir()


def _create(folder: Path, resume: bool) -> bool:
    if resume:
        if not folder.is_dir():
            raise UsageError(f"--resume: no run to continue at {folder}")
        return False
    try:
        folder.mkdir(parents=True)
    except FileExistsError:
        raise UsageError(f"results directory {folder} exists; pass --resume to continue it or --out for a new one") from None
    except OSError as err:
        raise UsageError(f"cannot create results directory {folder}: {err.strerror}") from None
    return True


def _lock(path: Path, note: Callable[[str], None]) -> None:
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": dt.datetime.now().isoformat(timespec="seconds")}
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = _owner(path)
            if owner is None or not _stale(owner, me["host"]):
                raise UsageError(_in_use(path, owner, me["host"])) from None
            note(f"note: taking over the stale lock of pid {owner['pid']} on {owner['host']} (that process is gone)")
            path.unlink(missing_ok=True)
            continue
        except OSError as err:
            raise UsageError(f"cannot write to results directory {path.parent}: {err.strerror}") from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return
    raise UsageError(f"results directory {path.parent} is being claimed by another process")


def _owner(path: Path) -> dict | None:
    """The lock's owner, or None while its writer has created it but not yet written it."""
    try:
        owner = json.loads(path.read_text())
        return owner if isinstance(owner, dict) and {"pid", "host"} <= owner.keys() else None
    except (OSError, ValueError):
        return None


def _stale(owner: dict, host: str) -> bool:
    if owner["host"] != host:
        return False
    try:
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _in_use(path: Path, owner: dict | None, host: str) -> str:
    folder = path.parent
    if owner is None:
        return f"results directory {folder} is being claimed by another process"
    where = f"pid {owner['pid']} on {owner['host']}" + (f" since {owner['started']}" if owner.get("started") else "")
    if owner["host"] != host:
        return (f"results directory {folder} is in use by {where}; if that run is gone, "
                f"delete {path} and run again")
    return f"results directory {folder} is in use by {where}; wait for it to finish or stop it first"


def is_complete(path: Path) -> bool:
    """Whether the folder holds a finished run (run.json "complete"): what a resumed tune or sweep skips."""
    info = path / "run.json"
    return info.exists() and json.loads(info.read_text()).get("status") == "complete"
