"""Device values on the host in one read: what a round that must read several tensors pays once instead of once
each (one synchronisation on a GPU). `core.host_reads` counts the reads."""

from __future__ import annotations

import torch

EXACT_IN_FLOAT64 = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool)


def to_host(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Several device tensors on the host in one read (one synchronisation on a GPU instead of one each): flattened
    into one float64 buffer, copied once, split and cast back. Exact for floats up to 32 bits and for integers
    below 2**53 (token ids, node indices)."""
    for t in tensors:
        assert t.dtype in EXACT_IN_FLOAT64, f"to_host: {t.dtype} does not round-trip through float64"
    flat = torch.cat([t.reshape(-1).to(torch.float64) for t in tensors]).cpu()
    parts = flat.split([t.numel() for t in tensors])
    return [p.to(t.dtype).reshape(t.shape) for p, t in zip(parts, tensors)]


def to_device(values: list | torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Host values (a list, or a host tensor) on `device` without the host waiting: on CUDA a copy from pageable
    memory first waits for everything queued on the stream, so the values go through pinned memory, copied
    asynchronously (the pinned block is not reused before the copy has run); a tensor already there, or any on a
    CPU, is returned as it is."""
    t = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type == "cuda" and t.device.type == "cpu":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)
