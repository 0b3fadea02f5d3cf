"""The drafters' preallocated cache (`methods/layers.py`): `DraftKV` appends in place and keeps what it held when it
grows, `round_slots` lays a round out in one buffer (a lone sequence's own, no copy), and an attention call that
writes and reads its keys there (`Slots`) gives bit for bit what the concatenating call gives."""

from __future__ import annotations

import torch

from specbench_methods.layers import Attention, DraftKV, Rotary, Slots, round_slots

HEADS, D = 3, 8


def kv(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(HEADS, rows, D, generator=g), torch.randn(HEADS, rows, D, generator=g)


def test_a_draft_cache_appends_in_place_and_keeps_its_entries_when_it_grows():
    cache, parts = DraftKV(), [kv(n, i) for i, n in enumerate((5, 1, 70, 1))]
    assert cache.view() is None and cache.length == 0
    cache.append(*parts[0])
    buffer = cache.k
    cache.append(*parts[1])
    assert cache.k is buffer  # room was left: written in place
    for p in parts[2:]:
        cache.append(*p)
    assert cache.length == 77 and cache.k.shape[1] >= 77
    for got, want in zip(cache.view(), (torch.cat([p[j] for p in parts], 1) for j in range(2))):
        assert torch.equal(got, want)


def test_a_lone_sequences_round_is_its_own_buffer_and_a_batchs_is_padded():
    like = torch.empty(HEADS, 0, D)
    a, b = DraftKV(), DraftKV()
    a.append(*kv(4, 0))
    b.append(*kv(2, 1))
    slots, real = round_slots([a], 10, like)
    assert slots.start == 4 and slots.k.data_ptr() == a.k.data_ptr() and slots.k.shape[2] >= 14 and real.all()
    slots, real = round_slots([a, b], 10, like)
    assert slots.start == 4 and slots.k.shape[:3] == (2, HEADS, 14)
    assert real.tolist() == [[True] * 4, [True, True, False, False]]
    assert torch.equal(slots.k[1, :, :2], b.view()[0]) and not slots.k[1, :, 2:].any()


def test_attention_through_slots_equals_the_concatenating_call():
    torch.manual_seed(0)
    attn = Attention(16, 16, 6, HEADS, D)
    rotary = Rotary(D, 10000.0)
    cache = DraftKV()
    cache.append(*kv(7, 2))
    extra = kv(2, 3)
    x = torch.randn(1, 3, 16)
    cos, sin = rotary(torch.arange(7, 10)[None], x.dtype)
    mask = torch.ones(1, 3, 12, dtype=torch.bool)
    mask[0, 0, 10:] = False
    with torch.inference_mode():
        want, want_kv = attn(x, cos, sin, tuple(t[None] for t in cache.view()), mask, tuple(t[None] for t in extra))
        slots, _ = round_slots([cache], 5, torch.empty(HEADS, 0, D))
        slots.k[..., 7:9, :], slots.v[..., 7:9, :] = (t[None] for t in extra)
        got, got_kv = attn(x, cos, sin, Slots(slots.k, slots.v, 9), mask)
    assert torch.equal(got, want) and all(torch.equal(g, w) for g, w in zip(got_kv, want_kv))
    assert torch.equal(cache.k[:, 9:12], want_kv[0][0]) and cache.length == 7  # scratch past the cache
