"""torch.compile with static shapes, for the target's forwards (`target.compiled`) and the drafters' steps
(`StepGraphs`): one place that knows the modes, the backends and dynamo's limits.

Every graph is compiled whole (`fullgraph=True`: a graph break is an error, not a silent fall back to Python)
and for fixed shapes (`dynamic=False`): a new shape compiles a new graph, which is why callers pad their inputs
to a few sizes and compile them before anything is timed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


def static_graph(fn: Callable, mode: str) -> Callable:
    """`fn` under torch.compile in `mode` ("reduce-overhead": inductor and CUDA graphs; "inductor"/"default":
    inductor; any other name: that dynamo backend, e.g. "aot_eager" in tests), whole and for static shapes."""
    # Every graph of a process is counted against dynamo's recompile limit per code object (a test session
    # builds dozens of targets whose forwards share one): never hit it.
    limit = 1024
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), limit))
    compile_mode = "reduce-overhead" if mode == "reduce-overhead" else None
    backend = "inductor" if mode in ("reduce-overhead", "inductor", "default") else mode
    return torch.compile(fn, mode=compile_mode, backend=backend, fullgraph=True, dynamic=False)


class StepGraphs:
    """A drafter's compiled steps: one compiled function per step kind, each compiling a graph per set of input
    shapes (and static arguments). It keeps the seconds each graph's first call took (its compile) and which
    graphs were first called outside `warming` (compiled inside a timed round: run.json's late compiles)."""

    def __init__(self, mode: str, owner: str) -> None:
        self.mode = mode
        self.owner = owner  # the drafter's name, which prefixes its graphs' names
        self.seconds: dict[str, float] = {}
        self.late: list[str] = []
        self._warming = False
        self._fns: dict[str, Callable] = {}

    def __call__(self, kind: str, fn: Callable, *args, **static):
        """fn(*args, **static) through kind's compiled function (built from the first `fn` given for `kind`). The
        tensors (args: tensors or lists of them) are passed contiguous: a graph is specialised on its inputs'
        strides, and an expanded input (a beam's first level) would compile a graph of its own."""
        args = tuple([t.contiguous() for t in a] if isinstance(a, (list, tuple)) else a.contiguous() for a in args)
        compiled = self._fns.get(kind)
        if compiled is None:
            compiled = self._fns[kind] = static_graph(fn, self.mode)
        name = self.graph_name(kind, args, static)
        if name in self.seconds:
            return compiled(*args, **static)
        t0 = time.perf_counter()
        out = compiled(*args, **static)
        self.seconds[name] = time.perf_counter() - t0
        if not self._warming:
            self.late.append(name)
        return out

    def graph_name(self, kind: str, args: tuple, static: dict) -> str:
        """`owner kind`, the first input's shape and the static arguments, e.g. "NAME step 1x1x1728 features=True"
        (the other inputs' shapes follow from these and the planned capacity)."""
        return " ".join([self.owner, kind, _shape(args[0]), *(f"{k}={v}" for k, v in sorted(static.items()))])

    @contextmanager
    def warming(self) -> Iterator[None]:
        """Graphs first called inside are compiled before any timed round (not late)."""
        self._warming = True
        try:
            yield
        finally:
            self._warming = False


def _shape(a) -> str:
    """A tensor's shape as "BxTxH"; a list of tensors' as "n*" and the first's."""
    if isinstance(a, (list, tuple)):
        return f"{len(a)}*{_shape(a[0])}" if a else "0"
    return "x".join(map(str, a.shape))
