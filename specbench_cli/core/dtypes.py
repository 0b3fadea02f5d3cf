"""Dtype names, spelled one way: what records, folder names and messages write for a torch dtype
(`dtype_name`), and the names a user may type for one (`SPELLINGS`, read by `dtype_of`). Torch is imported only
by `dtype_of`, so the input checks that run before torch loads can use the names."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SPELLINGS = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
             "float16": "float16", "fp16": "float16"}


def dtype_name(dtype: torch.dtype | str) -> str:
    """`torch.bfloat16` -> "bfloat16" (a name already without the prefix is returned as it is)."""
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype a user's spelling names (a key of `SPELLINGS`)."""
    import torch

    return getattr(torch, SPELLINGS[name])
