"""torch.compile with static shapes, for the target's forwards (`target.compiled`) and the drafters' steps
(`StepGraphs`, built by `CompiledSteps.compile`): one place that knows the modes, the backends and dynamo's limits.

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
    shapes and dtypes (and static arguments). It keeps the seconds each graph's first call took (its compile,
    by the graph's name) and which graphs were first called outside `warming` (compiled inside a timed round:
    run.json's late compiles), a buffer that outgrew its planned capacity included.

    Under CUDA graphs ("reduce-overhead") a graph's outputs live in memory its next replay overwrites, so they
    are returned as copies, as the target's are."""

    def __init__(self, mode: str, owner: str) -> None:
        self.mode = mode
        self.owner = owner  # the drafter's name, which prefixes its graphs' names
        self.seconds: dict[str, float] = {}
        self.late: list[str] = []
        self._warming = False
        self._fns: dict[str, Callable] = {}
        self._names: dict[tuple, str] = {}  # every input's shape and dtype (and the static arguments) -> name

    @property
    def warm_calls(self) -> int:
        """Calls that make a shape's graph ready: CUDA graph trees run eagerly once, record on the second call,
        replay after; inductor and the other backends compile on the first."""
        return 3 if self.mode == "reduce-overhead" else 1

    def __call__(self, kind: str, fn: Callable, *args, **static):
        """fn(*args, **static) through kind's compiled function (built from the first `fn` given for `kind`). The
        tensors (args: tensors or lists of them) are passed with row-major strides (`_dense`): a graph is specialised
        on its inputs' strides, and an expanded input (a beam's first level) would compile a graph of its own."""
        args = tuple([_dense(t) for t in a] if isinstance(a, (list, tuple)) else _dense(a) for a in args)
        compiled = self._fns.get(kind)
        if compiled is None:
            compiled = self._fns[kind] = static_graph(fn, self.mode)
        key = (kind, *map(_signature, args), *sorted(static.items()))
        if key in self._names:
            return self._outputs(compiled(*args, **static))
        name = self._name(kind, args, static)
        t0 = time.perf_counter()
        out = compiled(*args, **static)
        self._names[key], self.seconds[name] = name, time.perf_counter() - t0
        if not self._warming:
            self.late.append(name)
        return self._outputs(out)

    def _name(self, kind: str, args: tuple, static: dict) -> str:
        """`owner kind`, the first input's shape and the static arguments, e.g. "NAME step 1x1x1728 flag=True"; a
        second graph under the same name (a buffer of another capacity, another dtype) gets " #2" and so on."""
        name = " ".join([self.owner, kind, _shape(args[0]), *(f"{k}={v}" for k, v in sorted(static.items()))])
        taken = sum(1 for n in self.seconds if n == name or n.startswith(name + " #"))
        return name if not taken else f"{name} #{taken + 1}"

    def _outputs(self, out):
        return torch.utils._pytree.tree_map(torch.clone, out) if self.mode == "reduce-overhead" else out

    @contextmanager
    def warming(self) -> Iterator[None]:
        """Graphs first called inside are compiled before any timed round (not late)."""
        self._warming = True
        try:
            yield
        finally:
            self._warming = False


def _dense(t: torch.Tensor) -> torch.Tensor:
    """t with row-major strides: a copy unless it has them. `contiguous()` is not enough: it keeps a slice's
    stride on a dimension of size 1, which a graph is specialised on all the same."""
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= size
    return t if t.stride() == tuple(reversed(strides)) else t.clone(memory_format=torch.contiguous_format)


def _signature(a) -> tuple:
    """What a graph is specialised on, of one input: its shape and dtype (each tensor's, for a list)."""
    if isinstance(a, (list, tuple)):
        return tuple(_signature(t) for t in a)
    return tuple(a.shape), a.dtype


def _shape(a) -> str:
    """A tensor's shape as "BxTxH"; a list of tensors' as "n*" and the first's."""
    if isinstance(a, (list, tuple)):
        return f"{len(a)}*{_shape(a[0])}" if a else "0"
    return "x".join(map(str, a.shape))


class CompiledSteps:
    """What a drafter whose steps compile shares (any network drafter): with `--compile`
    (`compile`) it runs its steps through `graphs`, on caches of one fixed capacity (`capacity`, the planned
    sequence length plus what a round adds: `round_room`), and compiles every shape a round gives before anything
    is timed (`warm_steps`). Its `name` prefixes its graphs' names; `device` is where its network runs."""

    name: str
    graphs: StepGraphs | None = None  # the compiled draft steps; None: eager
    capacity = 0  # compiled: each sequence's draft cache entries (its buffers' fixed shape); 0: eager, growing

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def compile(self, mode: str, longest: int, lanes: int) -> dict[str, float]:
        self.graphs = StepGraphs(mode, self.name)
        self.capacity = longest + self.round_room()
        with self.graphs.warming():
            for batch in range(1, lanes + 1):
                for _ in range(self.graphs.warm_calls):
                    self.warm_steps(batch)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return dict(self.graphs.seconds)

    def run_step(self, kind: str, fn: Callable, *args, **static):
        """fn(*args, **static): through kind's compiled graph when the steps are compiled, else as it is. For a
        step with no eager form of its own (a draft head: one graph beside the body's, so that its phase is still
        timed apart)."""
        return fn(*args, **static) if self.graphs is None else self.graphs(kind, fn, *args, **static)

    def late_compiles(self) -> list[str]:
        return [] if self.graphs is None else list(self.graphs.late)

    def round_room(self) -> int:
        """Draft cache entries a round writes past the committed positions (a tree's levels, a block)."""
        raise NotImplementedError

    def warm_steps(self, batch: int) -> None:
        """Run every compiled step once on zero inputs of each shape a round of `batch` sequences gives."""
        raise NotImplementedError
