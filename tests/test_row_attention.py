"""The row attention kernel (`core.row_attention`): attention as SDPA defines it, and every row's result a
function of the keys its mask shows and their order only — not of their slots, the rows beside it, the batch or
the thread count. That is what lets a batch-invariant verify row, a tree node's included, equal the one-token
decode at its position bit for bit."""

from __future__ import annotations

import pytest
import torch

from specbench_cli.core.row_attention import HEAD_DIMS, kernel, row_attention, rows_alone


def reference(q, k, v, mask, scale):
    """Attention in float64 through plain operators, [B, R, H * d]."""
    g = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(g, 1).double() for t in (k, v))
    scores = (q.double() @ k[:, :, :mask.shape[-1]].transpose(-1, -2)) * scale
    probs = scores.masked_fill(~mask[:, None], float("-inf")).softmax(-1)
    return (probs @ v[:, :, :mask.shape[-1]]).transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def random_case(seed, batch=1, heads=9, kv_heads=3, dim=64, rows=11, span=300, capacity=400, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, rows, dim, generator=g).to(dtype)
    k, v = (torch.randn(batch, kv_heads, capacity, dim, generator=g).to(dtype) for _ in range(2))
    mask = torch.rand(batch, rows, span, generator=g) < 0.7
    return q, k, v, mask


def test_the_kernel_builds_here():
    """CI builds it (g++ and ninja are set up): a target silently on the PyTorch forms would hide a regression."""
    assert kernel() is not None
    assert rows_alone(torch.device("cpu"), torch.bfloat16, 64)
    assert not rows_alone(torch.device("cpu"), torch.float32, 64)  # float32 keeps SDPA, the reference path
    assert not rows_alone(torch.device("cpu"), torch.bfloat16, 40)  # a head dim it is not built for


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("dim", [16, 64, 128])
def test_equals_attention_within_rounding(dtype, tolerance, dim):
    q, k, v, mask = random_case(dim, batch=2, dim=dim, dtype=dtype)
    out = row_attention(q, k, v, mask, dim ** -0.5)
    assert out.dtype == dtype and out.shape == (2, 11, 9 * dim)
    assert (out.double() - reference(q, k, v, mask, dim ** -0.5)).abs().max().item() < tolerance


def test_every_row_is_computed_alone():
    """Each row of an 11-row call equals a call of that row alone, rows of a batch equal their sequence alone,
    and one thread gives what two give."""
    q, k, v, mask = random_case(1, batch=2)
    together = row_attention(q, k, v, mask, 0.125)
    for b in range(2):
        for r in range(11):
            alone = row_attention(q[b:b + 1, :, r:r + 1], k[b:b + 1], v[b:b + 1], mask[b:b + 1, r:r + 1], 0.125)
            assert torch.equal(alone, together[b:b + 1, r:r + 1]), (b, r)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(row_attention(q, k, v, mask, 0.125), together)
    finally:
        torch.set_num_threads(threads)


def test_a_row_depends_on_its_keys_order_not_their_slots():
    """A tree node's ancestors sit at other slots than the decode at its position puts them: the same keys in the
    same order, moved to other slots (and a longer cache behind them), give the same bits."""
    q, k, v, mask = random_case(2, rows=1, span=300)
    seen = mask[0, 0].nonzero().flatten()
    moved_k, moved_v = torch.zeros_like(k), torch.zeros_like(v)
    moved_k[:, :, :len(seen)], moved_v[:, :, :len(seen)] = k[:, :, seen], v[:, :, seen]
    packed = torch.zeros(1, 1, len(seen) + 5, dtype=torch.bool)
    packed[..., :len(seen)] = True
    assert torch.equal(row_attention(q, k, v, mask, 0.125), row_attention(q, moved_k, moved_v, packed, 0.125))


def test_a_row_that_sees_nothing_is_zeros():
    q, k, v, mask = random_case(3, rows=3)
    mask[0, 1] = False
    out = row_attention(q, k, v, mask, 0.125)
    assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1])) and out[0, 0].abs().sum() > 0


def test_head_dims_it_is_built_for():
    for dim in HEAD_DIMS:
        q, k, v, mask = random_case(dim, heads=2, kv_heads=1, dim=dim, rows=2, span=40, capacity=40)
        assert (row_attention(q, k, v, mask, 0.1).double() - reference(q, k, v, mask, 0.1)).abs().max() < 2e-2
