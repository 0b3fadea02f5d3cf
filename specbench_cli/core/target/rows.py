"""What a forward runs and gives back: each sequence's rows (`Rows`), its output (`Out`), what a proposer may add to
a verify (`VerifyExtras`, `SideTokens`), and how a batch's rows sit side by side for one forward (`Layout`,
`padded`, `visibility`, `unpack`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench_cli.core.host_copy import to_device


@dataclass
class SideTokens:
    """Rows that ride along in a verify forward without changing the tree's logits."""

    embeds: torch.Tensor  # [M, H] input embeddings
    positions: torch.Tensor  # [M] position offsets from the committed length
    attend: torch.Tensor  # bool [M, N+1]: which of root + nodes each side row sees

    def __len__(self) -> int:
        return self.embeds.shape[0]


@dataclass
class VerifyExtras:
    """What a proposer may add to the target's verify forward."""

    side: SideTokens | None = None
    root_logits: torch.Tensor | None = None  # the root is already cached (by `forward`); these are its logits


@dataclass
class Rows:
    """One sequence's rows in a forward (`TargetModel.run`): their inputs, positions and what each row sees."""

    # the sequence, a `model.Target` (not imported: that module imports this one); its slot, committed length
    # and reserved entries say where the rows go
    target: Target
    embeds: torch.Tensor  # [n, H] input embeddings
    positions: torch.Tensor  # [n] absolute positions, on the device
    block: torch.Tensor | None  # bool [n, n]: which of these rows each row sees; None: plain causality (a prefill)
    sees_reserved: torch.Tensor  # bool [n]: the rows that see the reserved entries (side rows)
    heads: slice  # the rows whose logits are wanted

    def __len__(self) -> int:
        return self.embeds.shape[0]


@dataclass
class Out:
    """What a forward gives one sequence: the logits of its `heads` rows and every row's final hidden state."""

    logits: torch.Tensor
    hidden: torch.Tensor


@dataclass
class Layout:
    """How one forward's rows sit, as every layer reads it: B sequences of R rows each (padded to the longest).

    `real`: the rows are packed (inputs [1, T, H] hold only the rows it names, in order): the row-wise work runs
    on them alone and only attention sees the [B, R] layout. `orders` and `written` are filled by the attention
    that needs them: each row's keys in the order a one-token decode reads them (`backends.ExactOrders`), and
    each layer's keys and values of the rows, for the host to write (`compiled.RowsApart`)."""

    mask: torch.Tensor | None  # bool [B, 1, R, S]: which cache slots each row sees; None: plain causality (a prefill)
    slots: torch.Tensor  # [B, R]: the cache slot of each row
    sees_reserved: torch.Tensor  # bool [B, R]: the rows that see the reserved entries
    real: torch.Tensor | None = None  # long [T]: the rows present (b * R + r, in order), where the inputs are packed
    offset: int = 0  # reserved entries at the front of each sequence's cache
    first_slot: int = 0  # the slot of the first sequence
    block: torch.Tensor | None = None  # bool [B, R, R]: which of its sequence's rows each row sees (compiled)
    orders: list | None = None  # per sequence, an `attention.DecodeOrder`
    written: list[torch.Tensor] | None = None  # per layer, [2, B, kv heads, R, d]


def padded(work: list[Rows], size: int, rows: int, first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequences' blocks and reserved-entry flags laid out [size, rows(, rows)], each at its slot - `first`;
    padding rows and other indices see only themselves. The blocks are laid out on the device where a tree left
    its block there (`DraftTree.mask`), else on the host."""
    block = torch.eye(rows, dtype=torch.bool).repeat(size, 1, 1)
    on_device = [x.block.device for x in work if x.block.device.type != "cpu"]
    if on_device:
        block = to_device(block, on_device[0])
    sees = torch.zeros(size, rows, dtype=torch.bool)
    for x in work:
        b, m = x.target.slot - first, len(x)
        block[b, :m, :m] = x.block
        sees[b, :m] = x.sees_reserved
    return block, sees


def one_offset(work: list[Rows]) -> int:
    offsets = {x.target.offset for x in work}
    assert len(offsets) == 1, "sequences of one forward have the same reserved entries"
    return offsets.pop()


def visibility(block: torch.Tensor, sees_reserved: torch.Tensor, base: torch.Tensor, kv_len: int,
               offset: int = 0) -> torch.Tensor:
    """Boolean [B, 1, rows, kv_len] mask of which cache slots each row of each sequence attends to, for
    sequences whose rows `block` [B, rows, rows] sit at slots base [B] onwards, after `offset` reserved entries."""
    batch, rows, r = block.shape[0], block.shape[1], offset
    cols = torch.arange(kv_len, device=block.device)[None, None]
    rel = cols - base[:, None, None]
    prefix = (rel < 0) & ((cols >= r) | sees_reserved[:, :, None])
    own = ((rel >= 0) & (rel < rows)) & block.gather(2, rel.clamp(0, rows - 1).expand(batch, rows, kv_len))
    return (prefix | own)[:, None]


def unpack(x: torch.Tensor, real: torch.Tensor, batch: int, rows: int) -> torch.Tensor:
    """Packed rows [1, heads, T, d] laid out as [B, heads, R, d], the rows `real` names (b * R + r) filled in order
    (an index, not a boolean mask: the device learns no shape from values)."""
    full = x.new_zeros(batch * rows, x.shape[1], x.shape[3])
    full[real] = x[0].transpose(0, 1)
    full = full.view(batch, rows, x.shape[1], x.shape[3])
    return full.transpose(1, 2)
