"""Counting the host's reads of device values, on any device: what a round would synchronise on a GPU.

On CUDA every read of a tensor's values by the host waits for the device: `.item()`, `.tolist()`, `.cpu()`,
`.numpy()`, a truth test, `int()` / `float()` / use as an index, and an op whose output's shape depends on the
values (`nonzero`, boolean-mask indexing, `unique`). On a CPU nothing waits, so the same code can only be counted.
`HostReads` follows which tensors would live on the device, starting from the given roots (the networks'
parameters and buffers): the output of any op that reads one, and of a factory or `.to()` told a device. Tensors
the host builds itself (`torch.tensor(list)` with no device) are host values, and reading them costs nothing.

    with HostReads(roots) as reads:
        ...                      # one round
    reads.count, reads.sites     # reads of device values, and where each was made (file:line of the caller)
    reads.uploads                # blocking copies of host values to the device, and where

An upload waits too: on CUDA a copy from pageable host memory first waits for everything queued on the stream.
`torch.tensor(data, device=...)`, `.to(device)` of a host value, a host value written into a device tensor and a
host index tensor indexing one are counted; `core.host_copy.to_device` (pinned memory, asynchronous) is not.

`per_round(reads)` splits the count by the rounds of `core.engine`'s loop (and, on CUDA, counts the
synchronisations the device's own sync-debug mode reports, which see every wait, host uploads included).
"""

from __future__ import annotations

import collections
import traceback
import warnings
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

# Tensor methods and functions that hand the host a device tensor's values.
READS = frozenset({"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "__len__"})
# Ops whose output's shape depends on the input's values (the host must learn the shape).
SHAPED = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"})


class HostReads(TorchFunctionMode):
    """Counts reads of device values, and blocking uploads of host values, while active (a torch function mode:
    every tensor op passes through it)."""

    def __init__(self, roots: Iterable[torch.Tensor]) -> None:
        super().__init__()
        self._device: dict[int, weakref.ref] = {}  # id -> the tensor (a set would compare tensors with ==)
        for t in roots:
            self._mark(t)
        self.sites: collections.Counter[str] = collections.Counter()
        self.uploads: collections.Counter[str] = collections.Counter()  # blocking copies of host values to the device

    def _mark(self, t: torch.Tensor) -> None:
        self._device[id(t)] = weakref.ref(t)

    def on_device(self, t: torch.Tensor) -> bool:
        ref = self._device.get(id(t))
        return ref is not None and ref() is t

    @property
    def count(self) -> int:
        return sum(self.sites.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        inputs = [t for t in _tensors((args, kwargs)) if self.on_device(t)]
        if inputs and (name in READS or name in SHAPED or _boolean_index(name, args)):
            self.sites[f"{name} {_caller()}"] += 1
        if _uploads(name, args, kwargs, inputs, self.on_device):
            self.uploads[f"{name} {_caller()}"] += 1
        out = func(*args, **kwargs)
        if name in ("cpu", "numpy"):  # a host copy (on a CPU `.cpu()` returns the tensor itself: now a host value)
            for t in _tensors(out):
                self._device.pop(id(t), None)
        elif inputs or _told_a_device(name, args, kwargs):
            for t in _tensors(out):
                self._mark(t)
        return out


@dataclass
class Round:
    """One round's reads of device values (`sites` as in `HostReads`) and, on CUDA, the synchronisations the
    device's sync-debug mode reported (None elsewhere)."""

    reads: int
    sites: collections.Counter[str] = field(default_factory=collections.Counter)
    cuda_syncs: int | None = None
    uploads: collections.Counter[str] = field(default_factory=collections.Counter)  # blocking host -> device copies


@contextmanager
def per_round(reads: HostReads, device: torch.device) -> Iterator[list[Round]]:
    """While active (with `reads` active too), each round of `core.engine`'s loop appends its `Round`."""
    from specbench_cli.core import engine

    rounds: list[Round] = []
    original = engine._round
    cuda = device.type == "cuda"

    def counted(*args, **kwargs):
        before, uploaded = collections.Counter(reads.sites), collections.Counter(reads.uploads)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = original(*args, **kwargs)
        syncs = sum("synchronizing CUDA operation" in str(w.message) for w in caught)
        rounds.append(Round(reads.count - before.total(), reads.sites - before, syncs if cuda else None,
                            reads.uploads - uploaded))
        return out

    engine._round = counted
    if cuda:
        torch.cuda.set_sync_debug_mode("warn")
    try:
        yield rounds
    finally:
        engine._round = original
        if cuda:
            torch.cuda.set_sync_debug_mode("default")


def _tensors(obj) -> Iterable[torch.Tensor]:
    """The tensors in nested tuples, lists and dicts."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)


def _boolean_index(name: str, args: tuple) -> bool:
    """`x[mask]` with a boolean tensor: its shape is the mask's count of True."""
    if name != "__getitem__" or len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)


def _uploads(name: str, args: tuple, kwargs: dict, inputs: list, on_device) -> bool:
    """A blocking copy of host values to the device (on CUDA, from pageable memory, the host waits for the stream):
    `torch.tensor(data, device=...)`, `.to(device)` of a host value without non_blocking, a host value written
    into a device tensor, or a host index tensor indexing one."""
    if name in ("tensor", "as_tensor"):  # (an empty one copies nothing)
        return kwargs.get("device") is not None and not (isinstance(args[0], (list, tuple)) and not args[0])
    if name in ("to", "cuda"):
        return not inputs and not kwargs.get("non_blocking", False) and _told_a_device(name, args, kwargs)
    if name in ("copy_", "__setitem__", "__getitem__", "index_select", "gather", "scatter_", "index_put_"):
        if not args or not isinstance(args[0], torch.Tensor) or not on_device(args[0]):
            return False
        return any(t.dim() > 0 and not on_device(t) for t in _tensors(args[1:]))
    return False


def _told_a_device(name: str, args: tuple, kwargs: dict) -> bool:
    """A factory given `device=`, or `.to()` / `.cuda()` given a device: its output lives on the device."""
    if kwargs.get("device") is not None or name == "cuda":
        return True
    return name == "to" and any(isinstance(a, (torch.device, str)) for a in args[1:])


# Modules that read for their callers (`to_host`, a tree's own read of its tokens): a read is named at the caller.
_PASSED_THROUGH = (__file__, str(Path(__file__).with_name("host_copy.py")), str(Path(__file__).with_name("tree.py")))


def _caller() -> str:
    """folder/file:line of the innermost frame outside torch and the modules that read for their callers (where
    the read was asked for)."""
    for frame in reversed(traceback.extract_stack()):
        if "/torch/" not in frame.filename and frame.filename not in _PASSED_THROUGH:
            path = Path(frame.filename)
            return f"{path.parent.name}/{path.name}:{frame.lineno}"
    return "?"
