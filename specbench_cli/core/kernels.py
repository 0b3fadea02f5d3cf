"""Row-wise parts of the target's forward (projections, MLPs, the output head) with CPU weights prepacked.

Why: on a CPU, a bf16 `F.linear` hands oneDNN a plain row-major weight, and oneDNN reorders it into its
blocked (VNNI) layout on every call; for a decode, which reads every weight once per token from DRAM, that
reorder costs more than the product. Reordering each weight once (`torch.ops.mkldnn._reorder_linear_weight`,
the op inductor's CPU freezing pass uses) and calling oneDNN's linear on the packed weight
(`_linear_pointwise`) does the same arithmetic: on the embedded model's shapes the outputs are bit for bit
those of `F.linear` for every row count (tests/test_kernels.py), so packing changes speed, not tokens. On a CPU
with bf16 instructions and weights far larger than its L3, the packed GEMMs of one forward are faster than the
plain ones, for one row and for eight.

bf16/fp16 are packed wherever they are used. A plain float32 target on a CPU is packed too and gets the
half-precision path's row kernel and one-call layers (`float32_kernels`; SPECBENCH_FP32_KERNELS=0 turns that off):
on a CPU without bf16 instructions, where `--dtype auto` picks float32, oneDNN's packed one-row GEMMs read the wide
weights faster than MKL's sgemm, and one C++ call replaces a decode's small PyTorch operators (forward times:
benchmarks/results/code-ab/fp32-kernels.json; against vLLM: benchmarks/results/vllm-parity/). A packed float32
weight goes through oneDNN instead of MKL and rounds differently, so float32 tokens may leave the reference path's
at near-ties. A batch-invariant float32 target keeps the reference path (MKL's sgemm, PyTorch's attention and
layers): it is the target the greedy replay judges every engine by, and bit-exact verify rows are established in
half precision only (tests/test_batch_invariant.py). The packed copies live beside the model's own weights
(a model's own `generate()` reads those), so the target's projections take twice their memory on a CPU, unless a
run that reads nothing else frees the plain ones (`keep_one_copy`): an 8 B target in bf16 then fits a 24 GiB
machine.

Linears over one input are stacked into one packed weight (`Stacked`: q, k and v; the MLP's gate and up): one
oneDNN call reads the three (two) weights instead of one call each. Each output column is still one weight row
against the input, and on the embedded model's shapes the stacked call gives every part bit for bit what its
own call gives, at every row count (tests/test_kernels.py; the target probes it on the running machine,
`core.target.probes.stacks_agree`, and calls each linear on its own where it fails). On a CPU with bf16
instructions the GEMMs of one decode take less time as four calls per layer than as seven.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F

PACKED_DTYPES = (torch.bfloat16, torch.float16)  # packed wherever they are used (their packed bits are F.linear's)
TARGET_PACKED_DTYPES = (*PACKED_DTYPES, torch.float32)  # what a target that packs packs (`packs`)
PACK_ROWS = 8  # the row count oneDNN is told to expect (a decode has 1, a verify a few to 64)

# nn.Linear or Stacked -> (its weights' identity when packed, the packed weight, the bias): one packed copy per
# module, shared by every Target over the model (a batch's slots, calibration's several targets); repacked if a
# weight changed.
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# a parent module (attention, MLP) -> its Stacked linears, by the linears' names
_STACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# linears whose plain weight was freed (`keep_one_copy`): their packed copies are their only weights
_RELEASED: weakref.WeakSet = weakref.WeakSet()
QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


class Stacked:
    """Linears of one parent module over the same input, as one linear whose output is theirs side by side
    (`sizes` columns each). Its weight and bias are built only when it is packed."""

    def __init__(self, linears: list[torch.nn.Linear]) -> None:
        self.linears = linears
        self.sizes = [m.out_features for m in linears]

    @property
    def weight(self) -> torch.Tensor:
        return torch.cat([m.weight.detach() for m in self.linears])

    @property
    def bias(self) -> torch.Tensor | None:
        if all(m.bias is None for m in self.linears):
            return None
        return torch.cat([m.weight.new_zeros(m.out_features) if m.bias is None else m.bias.detach()
                          for m in self.linears])

    @property
    def in_features(self) -> int:
        return self.linears[0].in_features

    @property
    def device(self) -> torch.device:
        return self.linears[0].weight.device


def shape(module: torch.nn.Linear | Stacked) -> tuple[int, int]:
    """A linear's weight shape (out, in), a `Stacked` one's as if its weights were one."""
    if isinstance(module, Stacked):
        return sum(module.sizes), module.in_features
    return tuple(module.weight.shape)


def stacked(parent: torch.nn.Module, names: tuple[str, ...]) -> Stacked:
    """The `Stacked` linears `names` of `parent` (made once per parent and names)."""
    held = _STACKS.setdefault(parent, {})
    if names not in held:
        held[names] = Stacked([getattr(parent, name) for name in names])
    return held[names]


def _identity(weight: torch.Tensor) -> tuple[int, int]:
    return weight.data_ptr(), 0 if weight.is_inference() else weight._version  # inference tensors have no version


def _key(linears: list[torch.nn.Linear]) -> tuple:
    """The weights' and biases' identities a packed copy was made from."""
    return tuple((_identity(m.weight), None if m.bias is None else _identity(m.bias)) for m in linears)


def packed(module: torch.nn.Linear | Stacked) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`module`'s weight packed for oneDNN's linear (made once, again if a weight changed) and its bias."""
    linears = module.linears if isinstance(module, Stacked) else [module]
    held = _PACKED.get(module)
    key = _key(linears)
    if held is None or held[0] != key:
        if any(m in _RELEASED for m in linears):  # freed behind a copy packed before (a probe's): that copy stays
            if held is not None:
                return held[1], held[2]
            raise RuntimeError(f"a {shape(module)} weight has to be packed, but its plain weight was freed when the "
                               "target kept one copy of each weight (kernels.keep_one_copy)")
        weight = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), PACK_ROWS)
        held = _PACKED[module] = key, weight, module.bias
    return held[1], held[2]


def released(module: torch.nn.Module) -> bool:
    """Whether `module`'s plain weight was freed (`keep_one_copy`): it reads NaN."""
    return module in _RELEASED


def keep_one_copy(model: torch.nn.Module, kernels: RowKernels) -> int:
    """Pack now every weight the target's forward reads packed (`kernels`' choice of stacking) and free the plain
    weight behind each, layer by layer, so that the peak holds one layer twice, not the model; the bytes freed.
    A freed weight keeps its shape, dtype and device, and reads as NaN: whatever still multiplies by it (a model's
    own forward, an unpacked target) gives NaN, and repacking it raises. The output head stays where the input
    embedding shares its weight. Only for a run where nothing but packed targets reads the model (the caller's
    check: `planning.one_weight_copy`)."""
    if not kernels.packed:
        return 0
    freed = 0
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if kernels.stack:
            modules = [stacked(attn, QKV), attn.o_proj, stacked(mlp, GATE_UP), mlp.down_proj]
        else:
            modules = [*(getattr(attn, n) for n in (*QKV, "o_proj")), *(getattr(mlp, n) for n in (*GATE_UP, "down_proj"))]
        freed += sum(_release(m) for m in modules)
    head = model.get_output_embeddings()
    if head.weight is not model.get_input_embeddings().weight:
        freed += _release(head)
    return freed


def keep_one_copy_of(networks: list[torch.nn.Module]) -> int:
    """`keep_one_copy` for drafters: every `Linear` of `networks` in half precision where this build packs it (a
    float32 drafter layer keeps its plain weight: `F.linear` reads it with the float32 kernels off), and every
    stack of such linears a module lists in `stacks` (`linears`), packed now and the plain weights freed; the bytes
    freed. Everything is packed before anything is freed, so two stacks may share a linear (q/k/v and k/v). Their
    forwards read the packed copies outside autograd only (`linear`): a run's drafting, never training."""
    def half(m: torch.nn.Module) -> bool:
        return isinstance(m, Linear) and m.weight.dtype in PACKED_DTYPES and _packable(m.weight.dtype)

    modules = [m for net in networks for m in net.modules()]
    chosen: list[torch.nn.Linear | Stacked] = [m for m in modules if half(m)]
    chosen += [stacked(m, names) for m in modules for names in getattr(m, "stacks", ())
               if all(half(getattr(m, name)) for name in names)]
    for module in chosen:
        packed(module)
    return sum(_release(m) for m in chosen)


def _release(module: torch.nn.Linear | Stacked) -> int:
    """Pack `module` and free the plain weights behind it (`keep_one_copy`); the bytes freed. The packed copy is
    re-keyed to the placeholders, so that `packed` finds it as it finds any other (no extra test per call)."""
    weight, bias = packed(module)
    linears = module.linears if isinstance(module, Stacked) else [module]
    freed = 0
    for m in linears:
        if m in _RELEASED:
            continue
        w = m.weight
        freed += w.numel() * w.element_size()
        m.weight = torch.nn.Parameter(torch.full((), float("nan"), dtype=w.dtype, device=w.device).expand(w.shape),
                                      requires_grad=False)
        _RELEASED.add(m)
    _PACKED[module] = _key(linears), weight, bias
    return freed


def zero_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [..., r, H] with zero rows below it, `rows` in all (a call padded to a row count its kernel rounds alike)."""
    return torch.cat((x, x.new_zeros(*x.shape[:-2], rows - x.shape[-2], x.shape[-1])), dim=-2)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch build has oneDNN's packed linear for this dtype on this device."""
    if device.type != "cpu" or dtype not in PACKED_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    supported = (torch.ops.mkldnn._is_mkldnn_bf16_supported() if dtype == torch.bfloat16
                 else torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return bool(supported) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def _packable(dtype: torch.dtype) -> bool:
    return can_pack(torch.device("cpu"), dtype)


def linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`module(x)` outside autograd on a CPU, on its packed weight (a drafter's layers, a drafter's read of the
    target's head, a draft model's head):
    - in half precision, where packing gives `F.linear`'s bits without the per-call reorder. Drafters are small, so
      their reorder is a smaller share than the target's, but it is paid at every draft step: the nine linears of
      a one-layer drafter of the embedded model (576-1728 wide, a 4096-token head) run faster packed, in bf16 for
      one row, with equal outputs;
    - in float32 with the float32 kernels on (`float32_kernels`), as a plain float32 target's own linears: MKL's
      sgemm reads a draft step's ten rows, or a wide head's one, at about half oneDNN's packed speed on a CPU
      (benchmarks/results/drafting/float32-packed-drafter-linears-cpu.json); where a target packed the module (its
      head, read by a drafter that has none of its own) the drafter reads the copy the target reads. The packed
      product rounds otherwise than `F.linear`, as a packed float32 target's does; drafts may change at near-ties,
      outputs never (the target decides every token). SPECBENCH_FP32_KERNELS=0 keeps `F.linear`."""
    if _packed_here(x, [module]):
        return _packed_product(module, x)
    return F.linear(x, module.weight, module.bias)


def _packed_here(x: torch.Tensor, modules: list[torch.nn.Linear]) -> bool:
    """Whether `linear` and `linears` read packed weights for input x: on a CPU, outside autograd and outside a
    compiled graph (inductor lays out a graph's weights itself), where every module's weight is read packed
    (`_reads_packed`)."""
    return (x.device.type == "cpu" and not torch.is_grad_enabled() and not torch.compiler.is_compiling()
            and all(_reads_packed(m) for m in modules))


def _packed_product(module: torch.nn.Linear | Stacked, x: torch.Tensor) -> torch.Tensor:
    weight, bias = packed(module)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _reads_packed(module: torch.nn.Linear) -> bool:
    """`linear`'s choice of weight: half precision where this build packs it; float32 with the float32 kernels on,
    or where a target packed it."""
    dtype = module.weight.dtype
    if dtype in PACKED_DTYPES:
        return _packable(dtype)
    return dtype == torch.float32 and (module in _PACKED or (float32_kernels() and _float32_packable()))


class Linear(torch.nn.Linear):
    """nn.Linear whose forward is `linear`'s (the same parameters and state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(self, x)


def linears(parent: torch.nn.Module, names: tuple[str, ...], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`getattr(parent, name)(x)` for each of `names` (a drafter's linears over one input: q/k/v, gate/up), as one
    packed call of their `stacked` weight where `linear` reads packed weights: one oneDNN call reads the three (two)
    weights, as the target's stacked projections do. A parent that stacks lists its stacks in `stacks`, so that
    `keep_one_copy_of` packs them before it frees the plain weights."""
    modules = [getattr(parent, name) for name in names]
    if _packed_here(x, modules):
        both = stacked(parent, names)
        return _packed_product(both, x).split(both.sizes, dim=-1)
    return tuple(m(x) for m in modules)


def read_packed(model: torch.nn.Module) -> torch.nn.Module:
    """`model` (a Hugging Face draft model) with each plain `nn.Linear` made a `Linear`: the same parameters and
    state dict, its forward `linear`'s, so a draft model's body reads packed weights as a drafter's own layers do
    (the class is changed in place; autograd still sees `F.linear`)."""
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = Linear
    return model


def float32_kernels() -> bool:
    """Whether a plain float32 target on a CPU runs the kernels half precision runs (packed GEMMs, the row kernel,
    the one-call layers) rather than the reference path: yes unless SPECBENCH_FP32_KERNELS=0 (module docstring)."""
    return os.environ.get("SPECBENCH_FP32_KERNELS", "1") != "0"


@functools.cache
def _float32_packable() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def packs(device: torch.device, dtype: torch.dtype, compiled: bool, invariant: bool = False) -> bool:
    """Whether the target packs its weights: eager forwards on a CPU, where this build can (a compiled
    forward is inductor's to lay out); float32 only for a plain target with `float32_kernels`."""
    if compiled:
        return False
    if dtype == torch.float32:
        return device.type == "cpu" and not invariant and float32_kernels() and _float32_packable()
    return can_pack(device, dtype)


class RowKernels:
    """Callables for the target's row-wise modules: the module itself, or its packed twin when `packed`."""

    def __init__(self, packed: bool) -> None:
        self.packed = packed
        self.stack = packed  # q/k/v and gate/up as one call each (`Stacked`); the target may turn it off (probed)
        # weight shapes whose one-row call is padded to two rows (a batch-invariant target's probe, `core.target.choose`);
        # None: none is, and the target pads a one-row call of every module itself where it must
        self.pad_one_row: frozenset[tuple[int, int]] | None = None
        self._callables: dict[int, tuple[torch.nn.Module | Stacked, Callable]] = {}  # id(module) -> (module, callable)

    def __call__(self, module: torch.nn.Module | Stacked) -> Callable[[torch.Tensor], torch.Tensor]:
        """The callable for `module`, chosen once per module (a forward asks ~120 times)."""
        held = self._callables.get(id(module))
        if held is None or held[0] is not module:
            held = self._callables[id(module)] = module, self._choose(module)
        return held[1]

    def _choose(self, module: torch.nn.Module | Stacked) -> Callable[[torch.Tensor], torch.Tensor]:
        if not self.packed:
            return module
        if isinstance(module, Stacked) or (isinstance(module, torch.nn.Linear)
                                           and module.weight.dtype in TARGET_PACKED_DTYPES):
            return lambda x: self.linear(module, x)
        if (all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn"))
                and module.down_proj.weight.dtype in TARGET_PACKED_DTYPES):
            return lambda x: self.gated_mlp(module, x)
        return module

    def linear(self, module: torch.nn.Linear | Stacked, x: torch.Tensor) -> torch.Tensor:
        weight, bias = packed(module)
        if self.pad_one_row and x.shape[-2] == 1 and shape(module) in self.pad_one_row:
            return torch.ops.mkldnn._linear_pointwise(zero_rows(x, 2), weight, bias, "none", [], "")[..., :1, :]
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    def gated_mlp(self, mlp: torch.nn.Module, x: torch.Tensor, stack: bool | None = None) -> torch.Tensor:
        """Llama/Qwen's MLP, down(act(gate(x)) * up(x)), as its `forward` computes it; gate and up stacked where
        `stack` (None: where the kernels stack)."""
        if self.stack if stack is None else stack:
            both = stacked(mlp, GATE_UP)
            gate, up = self.linear(both, x).split(both.sizes, dim=-1)
        else:
            gate, up = self.linear(mlp.gate_proj, x), self.linear(mlp.up_proj, x)
        return self.linear(mlp.down_proj, mlp.act_fn(gate) * up)
