"""The CPU kernels under the target's forward change speed, not numbers: prepacked bf16 weights give F.linear's
outputs bit for bit at every row count, and the matmul attention computes what SDPA computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specbench_cli.core.kernels import GATE_UP, QKV, Linear, RowKernels, can_pack, linear, packed, stacked
from specbench_cli.core import kernels
from specbench_cli.core.attention import grouped_attention

CPU = torch.device("cpu")
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (4096, 576)]  # the embedded model's, a cut head


@pytest.mark.skipif(not can_pack(CPU, torch.bfloat16), reason="this torch build has no oneDNN bf16 linear")
@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_packed_bf16_linear_equals_the_module_at_every_row_count(out_features, in_features):
    torch.manual_seed(0)
    module = torch.nn.Linear(in_features, out_features, bias=out_features == 192).to(torch.bfloat16)
    packed = RowKernels(packed=True)(module)
    with torch.inference_mode():
        for rows in (1, 2, 3, 7, 8, 9, 16, 33, 64):
            x = torch.randn(1, rows, in_features, dtype=torch.bfloat16)
            assert torch.equal(packed(x), module(x)), rows


@pytest.mark.skipif(not can_pack(CPU, torch.bfloat16), reason="this torch build has no oneDNN bf16 linear")
@pytest.mark.parametrize("out_features, in_features", [(576, 1728), (192, 1152), (1024, 576), (4096, 576)])
def test_a_drafters_linear_is_the_modules_and_trains_as_one(out_features, in_features):
    """`kernels.Linear` (drafters' layers; the embedded EAGLE-3 drafter's shapes): outside autograd its packed call
    gives nn.Linear's bits at every row count, batched or not; with autograd it is nn.Linear (gradients flow)."""
    torch.manual_seed(0)
    ours = Linear(in_features, out_features, bias=False).to(torch.bfloat16)
    theirs = torch.nn.Linear(in_features, out_features, bias=False).to(torch.bfloat16)
    theirs.load_state_dict(ours.state_dict())
    with torch.inference_mode():
        for shape in ((1, in_features), (9, in_features), (3, 5, in_features)):
            x = torch.randn(*shape, dtype=torch.bfloat16)
            assert torch.equal(ours(x), theirs(x)), shape
    x = torch.randn(4, in_features, dtype=torch.bfloat16)
    ours(x).float().sum().backward()
    assert ours.weight.grad is not None and ours.weight.grad.abs().sum() > 0


def test_a_float32_linear_reads_a_packed_copy_with_the_float32_kernels_on(monkeypatch):
    """float32 `linear` outside autograd: a packed copy with the float32 kernels on (a drafter's own layer, and the
    target's head where a target packed it: the same copy), within float32 rounding of F.linear; with
    SPECBENCH_FP32_KERNELS=0, F.linear's bits and no copy; under autograd, F.linear (training)."""
    if not kernels._float32_packable():
        pytest.skip("this torch build has no oneDNN linear")
    torch.manual_seed(0)
    own, head = (torch.nn.Linear(576, out, bias=False) for out in (576, 4096))
    x = torch.randn(1, 15, 576)
    target_copy = packed(head)  # as a float32 target packs its head
    with torch.inference_mode():
        for module in (own, head):
            out = linear(module, x)
            assert module in kernels._PACKED and torch.allclose(out, F.linear(x, module.weight), atol=1e-4)
        assert packed(head)[0] is target_copy[0]
    with torch.no_grad():
        monkeypatch.setenv("SPECBENCH_FP32_KERNELS", "0")
        fresh = torch.nn.Linear(576, 4096, bias=False)
        assert torch.equal(linear(fresh, x), F.linear(x, fresh.weight)) and fresh not in kernels._PACKED
    monkeypatch.delenv("SPECBENCH_FP32_KERNELS")
    trained = torch.nn.Linear(576, 576, bias=False)
    assert torch.equal(linear(trained, x), F.linear(x, trained.weight)) and trained not in kernels._PACKED


@pytest.mark.skipif(not can_pack(CPU, torch.bfloat16), reason="this torch build has no oneDNN bf16 linear")
def test_packed_mlp_equals_the_module_and_follows_weight_changes():
    from transformers.models.llama.modeling_llama import LlamaMLP
    from transformers import LlamaConfig

    torch.manual_seed(0)
    mlp = LlamaMLP(LlamaConfig(hidden_size=64, intermediate_size=160, hidden_act="silu")).to(torch.bfloat16)
    kernels = RowKernels(packed=True)
    x = torch.randn(1, 5, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(kernels(mlp)(x), mlp(x))
    with torch.no_grad():
        mlp.up_proj.weight.mul_(2)  # an in-place change bumps the weight's version: repacked
    with torch.inference_mode():
        assert torch.equal(kernels(mlp)(x), mlp(x))


@pytest.mark.skipif(not can_pack(CPU, torch.bfloat16), reason="this torch build has no oneDNN bf16 linear")
@pytest.mark.parametrize("bias", [False, True])  # Qwen2's q/k/v carry biases
def test_stacked_linears_give_each_part_what_its_own_call_gives(bias):
    """q/k/v (and gate/up) as one packed call: every part bit for bit its own packed call, and so `F.linear`'s, at
    every row count, on the embedded model's shapes; the MLP stacked equals the module."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                         hidden_act="silu", attention_bias=bias)
    attn, mlp = LlamaAttention(config, 0).to(torch.bfloat16), LlamaMLP(config).to(torch.bfloat16)
    kernels = RowKernels(packed=True)
    qkv = stacked(attn, QKV)
    assert stacked(attn, QKV) is qkv and qkv.sizes == [576, 192, 192]
    with torch.inference_mode():
        for rows in (1, 2, 3, 7, 8, 9, 16, 33, 64):
            x = torch.randn(1, rows, 576, dtype=torch.bfloat16) * (rows / 8)
            parts = kernels(qkv)(x).split(qkv.sizes, dim=-1)
            for part, name in zip(parts, QKV):
                assert torch.equal(part, getattr(attn, name)(x)), (rows, name)
            assert torch.equal(kernels(mlp)(x), mlp(x)), rows
    assert kernels.stack and stacked(mlp, GATE_UP).sizes == [1536, 1536]
    with torch.no_grad():
        attn.k_proj.weight.mul_(2)  # a member's weight changed: the stack is packed again
    with torch.inference_mode():
        x = torch.randn(1, 4, 576, dtype=torch.bfloat16)
        assert torch.equal(kernels(qkv)(x).split(qkv.sizes, dim=-1)[1], attn.k_proj(x))


def test_unpacked_kernels_are_the_modules():
    module = torch.nn.Linear(4, 4)
    assert RowKernels(packed=False)(module) is module
    assert not can_pack(CPU, torch.float32)  # float32 keeps MKL's sgemm (see core.kernels)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_grouped_attention_computes_sdpa(dtype, tol):
    torch.manual_seed(0)
    q = torch.randn(2, 9, 5, 64, dtype=dtype)
    k, v = torch.randn(2, 3, 40, 64, dtype=dtype), torch.randn(2, 3, 40, 64, dtype=dtype)
    mask = torch.rand(2, 1, 5, 40) < 0.6
    mask[..., 0] = True  # every row sees something
    ours = grouped_attention(q, [(k, v, mask)], 0.125)
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=0.125,
                                               enable_gqa=True)
    assert ours.dtype == dtype
    torch.testing.assert_close(ours.float(), reference, atol=tol, rtol=tol)


def test_grouped_attention_over_two_parts_is_attention_over_their_concatenation():
    """A compiled forward attends over the cache's prefix and its own rows kept apart (core.target.RowsApart)."""
    torch.manual_seed(1)
    q = torch.randn(1, 9, 4, 64)
    k, v = torch.randn(1, 3, 30, 64), torch.randn(1, 3, 30, 64)
    mask = torch.rand(1, 1, 4, 30) < 0.5
    mask[..., 0] = True
    whole = grouped_attention(q, [(k, v, mask)], 0.125)
    apart = grouped_attention(q, [(k[:, :, :22], v[:, :, :22], mask[..., :22]),
                                  (k[:, :, 22:], v[:, :, 22:], mask[..., 22:])], 0.125)
    torch.testing.assert_close(apart, whole, atol=1e-6, rtol=1e-5)


@pytest.mark.skipif(not can_pack(CPU, torch.bfloat16), reason="this torch build has no oneDNN bf16 linear")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # Qwen3 normalises q and k before rotary: rotated apart
def test_a_stacked_bf16_target_verifies_what_one_call_per_linear_verifies(arch):
    """The target's forward with the stack (q/k/v one call, q and k rotated in one where no norm comes first) and
    without it: the same logits bit for bit, for a prefill, a tree verify and a decode."""
    from specbench_cli.core.target import Target
    from specbench_cli.core.tree import DraftTree
    from tests.conftest import tiny_model

    model = tiny_model(arch).to(torch.bfloat16)
    targets = [Target(model, CPU) for _ in range(2)]
    assert targets[0].shared.kernels.stack
    targets[1].shared.kernels.stack = False
    tree = DraftTree([5, 6, 7, 8], [0, 1, 1, 0])
    logits = []
    for t in targets:
        first = t.prefill(list(range(3, 40)))
        logits.append((first, t.verify(9, tree), t.verify(4, DraftTree.chain([]))))
    for stacked_out, apart in zip(*logits):
        assert torch.equal(stacked_out, apart)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not can_pack(CPU, torch.bfloat16), reason="this torch build has no oneDNN bf16 linear"))])
@pytest.mark.parametrize("stack", [True, False])
def test_a_target_that_keeps_one_copy_of_each_weight_verifies_what_it_did(dtype, stack):
    """`keep_one_copy` frees the plain weights behind the packed ones: a target built after it gives the logits
    one built before gave, bit for bit; what still reads a freed weight reads NaN, and repacking one raises."""
    from specbench_cli.core.target import Target
    from specbench_cli.core.tree import DraftTree
    from tests.conftest import tiny_model

    model = tiny_model("qwen3", layers=3).to(dtype)
    tree = DraftTree([5, 6, 7, 8], [0, 1, 1, 0])

    def target() -> Target:
        t = Target(model, CPU)
        t.shared.kernels.stack = stack
        return t

    def logits() -> tuple[torch.Tensor, ...]:
        t = target()
        return t.prefill(list(range(3, 40))), t.verify(9, tree), t.verify(4, DraftTree.chain([]))

    before = logits()
    rows = target().shared.kernels
    if not rows.packed:
        pytest.skip("this torch build does not pack float32")
    linears = [m for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    plain = sum(m.weight.numel() * m.weight.element_size() for m in [*linears, model.lm_head])
    assert kernels.keep_one_copy(model, rows) == plain
    assert kernels.keep_one_copy(model, rows) == 0  # freed once
    for out, again in zip(before, logits()):
        assert torch.equal(out, again)
    assert all(torch.isnan(m.weight).all() for m in [*linears, model.lm_head])
    assert model.model.embed_tokens.weight.isfinite().all()  # not the head's weight here: it stays
    never_packed = stacked(model.model.layers[0].mlp, ("up_proj", "down_proj"))
    with pytest.raises(RuntimeError, match="plain weight was freed"):
        packed(never_packed)


def test_a_head_that_is_the_embedding_keeps_its_weight():
    from specbench_cli.core.target import Target
    from tests.conftest import tiny_model

    model = tiny_model("llama")
    model.lm_head.weight = model.model.embed_tokens.weight
    rows = Target(model, CPU).shared.kernels
    if not rows.packed:
        pytest.skip("this torch build does not pack float32")
    kernels.keep_one_copy(model, rows)
    assert model.lm_head.weight.isfinite().all()
    assert torch.isnan(model.model.layers[0].mlp.down_proj.weight).all()


@pytest.mark.skipif(not can_pack(CPU, torch.bfloat16), reason="this torch build has no oneDNN bf16 linear")
def test_a_drafter_that_keeps_one_copy_of_each_weight_computes_what_it_did():
    """`keep_one_copy_of` packs and frees a drafter's half-precision `Linear`s: outside autograd the network gives
    what it gave; a float32 layer (which reads `F.linear`'s weight) keeps its weight."""
    from specbench_cli.core.method import Proposer, networks

    torch.manual_seed(0)
    net = torch.nn.Sequential(Linear(64, 128), torch.nn.SiLU(), Linear(128, 32)).to(torch.bfloat16)
    wide = Linear(16, 8)  # float32
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        before = net(x)

    class Drafter(Proposer):
        def __init__(self) -> None:
            self.draft, self.head = net, wide

    class Routed(Proposer):
        def __init__(self) -> None:
            self.proposers = {"a": Drafter(), "b": Drafter()}

    assert [id(n) for n in networks(Routed())] == [id(net), id(wide)]
    assert kernels.keep_one_copy_of(networks(Routed())) == 2 * (64 * 128 + 128 * 32)
    with torch.inference_mode():
        assert torch.equal(net(x), before)
    assert torch.isnan(net[0].weight).all() and wide.weight.isfinite().all()


@pytest.mark.skipif(not can_pack(CPU, torch.bfloat16), reason="this torch build has no oneDNN bf16 linear")
def test_stacked_drafter_projections_give_their_own_calls_outputs_before_and_after_one_copy():
    """A drafter layer's q/k/v, k/v and gate/up as one packed call each (`kernels.linears`, the layers' `stacks`):
    bit for bit the linears called one by one, and still so once `keep_one_copy_of` packed every stack and freed
    the plain weights (two stacks share k and v)."""
    from specbench_methods.layers import MLP, Attention, Rotary

    torch.manual_seed(0)
    attn = Attention(1152, 576, 9, 3, 64).to(torch.bfloat16)  # the embedded EAGLE-3 drafter's attention
    mlp = MLP(576, 1536).to(torch.bfloat16)
    x, h = torch.randn(5, 1152, dtype=torch.bfloat16), torch.randn(5, 576, dtype=torch.bfloat16)
    cos, sin = Rotary(64, 10000.0)(torch.arange(5), torch.bfloat16)
    with torch.inference_mode():
        for parent, names, inp in ((attn, attn.stacks[0], x), (attn, attn.stacks[1], x), (mlp, mlp.stacks[0], h)):
            one_by_one = [getattr(parent, n)(inp) for n in names]
            assert all(torch.equal(a, b) for a, b in zip(kernels.linears(parent, names, inp), one_by_one))
        before = attn(x, cos, sin), attn.keys_values(x, cos, sin), mlp(h)
    weights = sum(p.numel() * 2 for p in (*attn.parameters(), *mlp.parameters()))
    assert kernels.keep_one_copy_of([attn, mlp]) == weights
    assert torch.isnan(attn.k_proj.weight).all()
    with torch.inference_mode():
        after = attn(x, cos, sin), attn.keys_values(x, cos, sin), mlp(h)
    flat = lambda t: [t] if isinstance(t, torch.Tensor) else [y for s in t for y in flat(s)]  # noqa: E731
    assert all(torch.equal(a, b) for a, b in zip(flat(before), flat(after)))
