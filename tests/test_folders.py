"""One writer per results folder: the lock, stale locks, and folders left behind by a failed start."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from specbench_cli.core.errors import UsageError
from specbench_cli.folders import LOCK, claim


def test_a_second_writer_is_refused_while_the_first_holds_the_folder(tmp_path):
    out = tmp_path / "run"
    with claim(out, resume=False):
        with pytest.raises(UsageError, match="exists; pass --resume"):
            with claim(out, resume=False):
                pass
        (out / "run.json").write_text("{}")
        with pytest.raises(UsageError, match=f"in use by pid {os.getpid()} on {socket.gethostname()}"):
            with claim(out, resume=True):
                pass
    assert not (out / LOCK).exists()
    with claim(out, resume=True):  # released: a resume may take it now
        assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()


def test_a_dead_processs_lock_is_taken_over_and_named(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / LOCK).write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname(), "started": "then"}))
    notes = []
    with claim(out, resume=True, note=notes.append):
        assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()
    assert len(notes) == 1 and f"stale lock of pid {int(dead.stdout)}" in notes[0]


def test_a_lock_from_another_host_is_never_taken_over(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "then"}))
    with pytest.raises(UsageError, match="in use by pid 1 on elsewhere since then; if that run is gone, delete"):
        with claim(out, resume=True):
            pass


def test_a_failed_start_leaves_no_folder_behind(tmp_path):
    """The model failing to load must not leave an empty folder that the retry is told exists."""
    out = tmp_path / "run"
    with pytest.raises(RuntimeError):
        with claim(out, resume=False):
            raise RuntimeError("the model did not load")
    assert not out.exists()
    with pytest.raises(RuntimeError):  # something written: the folder stays (resumable), the lock goes
        with claim(out, resume=False):
            (out / "run.json").write_text("{}")
            raise RuntimeError("killed later")
    assert (out / "run.json").exists() and not (out / LOCK).exists()
