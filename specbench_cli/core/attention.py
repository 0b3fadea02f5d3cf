"""Attention over the target's cache as batched matmuls, and its batch-invariant form: every row of a verify
computed bit for bit as the one-token decode at its position computes it, all rows in a few calls.

Where the row attention kernel is built (`core.row_attention`, the usual case) an eager half-precision CPU
target attends with it instead; these PyTorch forms serve a compiled forward (`grouped_attention` over
`RowsApart`) and machines where the kernel cannot be built.

Why a form of our own: on a CPU in half precision, SDPA's one-query kernel is slow (`attends_by_matmul`), and
the kernels' rounding follows where a key sits and how many rows share a call. Measured with MKL's float32
matmuls on one CPU (random bf16-valued inputs, kv heads 3, head dim 64):
- q @ k^T: each score is the same for any number of query rows from 6 up (3 query heads x 2 rows), any
  number of keys and any key offset; one row alone (3 query rows) rounds differently;
- p @ v (reduction over keys): the same for any number of query rows from 6 up, for a fixed number of keys
  in a fixed order; it changes with where the keys start and how many there are;
- a batched matmul gives each batch element what it gives that element alone.
So `exact_attention` computes every row's scores in one call (a decode's one row doubled), reads them in the
order the decode at that row's position reads its keys (the prefix, the row's ancestors, itself), and sums
p @ v in two parts whose boundaries depend on the position only: the keys before the row's last TAIL-aligned
block (one call for all rows that share them) and that block (one batched call, a row each). `rows_agree`
checks those properties on the running machine; where they fail the rows are computed one call each.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

TAIL = 64  # keys in a row's last block, the part of p @ v it sums on its own


def attends_by_matmul(device: torch.device, dtype: torch.dtype) -> bool:
    """Half precision on a CPU, where SDPA's flash kernel for one query row is slower than `grouped_attention`
    (bf16, 9 heads, 512 to 3072 keys). Not in float32 and not for several rows, where SDPA is the faster."""
    return device.type == "cpu" and dtype in (torch.bfloat16, torch.float16)


def cudnn_sdpa() -> bool:
    """Whether SDPA may pick cuDNN's attention on CUDA in specbench's processes: only with SPECBENCH_SDPA_CUDNN=1
    (`leave_cudnn_out_of_sdpa`; run.json's environment.sdpa_cudnn)."""
    return os.environ.get("SPECBENCH_SDPA_CUDNN", "0") == "1"


def leave_cudnn_out_of_sdpa(leave_out: bool = True) -> None:
    """Whether PyTorch's SDPA may pick cuDNN's attention (process-wide; on a CPU it never does).

    Why leave it out: our forwards call SDPA with an explicit mask over a key span that grows every round (a
    decode reads one key more than the last), and cuDNN builds an execution plan for every new shape before it
    runs one (modelscope/FunASR#3704: on a B200 every new shape was slow; with cuDNN out of the order those
    steps ran as fast as the others). PyTorch puts cuDNN first on sm90 and sm100 when the cuDNN runtime is newer
    than 9.15 unless TORCH_CUDNN_SDPA_DEPRIORITIZED is set (`check_prefer_cudnn_attention` in
    aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, read on pytorch main).
    The slow eager rounds on a GPU recorded in benchmarks/results/readme/h200-check.json are what per-shape plans would cost: a
    verify inside a run slower than the same forward repeated at one context, a round that verified a draft
    (several rows) slower than one that verified one row, and a tree drafter's slow drafting (nine masked SDPA
    calls a round over its growing cache). Not yet measured with it left out."""
    torch.backends.cuda.enable_cudnn_sdp(not leave_out)


def one_query_by_matmul(q: torch.Tensor) -> bool:
    """Whether a one-query attention problem runs as `grouped_attention` instead of SDPA (`attends_by_matmul`)."""
    return attends_by_matmul(q.device, q.dtype)


def grouped_attention(q: torch.Tensor, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                      scale: float) -> torch.Tensor:
    """Masked attention as batched matmuls with float32 scores, softmax and sums (what SDPA computes; grouped
    query attention: query head h reads kv head h // group). q [B, H, R, d]; `parts`: (k, v [B, KVH, L, d],
    mask bool [B, 1, R, L], True: attend), attended jointly as if their keys were one sequence (a compiled
    forward's cache prefix and its own rows, `RowsApart`); returns [B, H, R, d] in q's dtype.

    For one query row in half precision on a CPU (`one_query_by_matmul`): a decode of the embedded model at 512
    cached keys spends less in attention, in each of its 30 layers, than with SDPA."""
    b, h, r, d = q.shape
    kvh = parts[0][0].shape[1]
    queries = q.float().reshape(b, kvh, h // kvh * r, d)
    scores = []
    for k, _, mask in parts:
        part = torch.matmul(queries, k.float().transpose(-1, -2)).mul_(scale).view(b, kvh, h // kvh, r, -1)
        scores.append(part.masked_fill_(~mask[:, :, None], float("-inf")))
    probs = (scores[0] if len(parts) == 1 else torch.cat(scores, -1)).softmax(-1).view(b, kvh, h // kvh * r, -1)
    out, first = None, 0
    for k, v, _ in parts:
        term = torch.matmul(probs[..., first:first + k.shape[2]], v.float())
        out, first = term if out is None else out + term, first + k.shape[2]
    return out.view(b, h, r, d).to(q.dtype)


# ------------------------------------------------------------------------------------ batch-invariant form
@dataclass
class RowGroup:
    """Rows of one verify whose keys before their last block are the same cache slots, in slot order
    (`head`, a range), or one row whose are not (`head`, its slots: a tree node deep enough that its
    ancestors reach back past its last block's start). Positions are cache slots minus the order's `start`;
    `tail` None: every row's last block is the TAIL slots from `head`'s end, in slot order (a chain, a decode)."""

    rows: torch.Tensor  # long [n]: the rows' indices in the verify
    head: tuple[int, int] | torch.Tensor  # keys before the last block: [lo, hi), or long [L] for one row
    tail: torch.Tensor | None  # long [n, TAIL]: each row's last-block keys in decode order, padded with its own slot
    seen: torch.Tensor  # bool [n, TAIL]: which of them it sees
    all_rows: bool  # the group is every row of the verify, in order

    @property
    def head_len(self) -> int:
        return self.head[1] - self.head[0] if isinstance(self.head, tuple) else len(self.head)


@dataclass
class DecodeOrder:
    """A sequence's verify rows, each with its visible keys in the order the one-token decode at its position
    reads them (the prefix, its ancestors, itself), grouped for `exact_attention`. Built once per forward
    (`decode_orders`), read by every layer."""

    start: int  # first cache slot any row sees
    filled: int  # one past the last row's slot: slots from here to `end` are read but masked for every row
    end: int  # one past the last slot a row reads (its last block's end, masked past what it sees)
    rows: int
    groups: list[RowGroup]


def decode_orders(mask: torch.Tensor, sees_reserved: torch.Tensor, slots: torch.Tensor,
                  offset: int) -> list[DecodeOrder]:
    """Each sequence's `DecodeOrder`, from the verify's mask [B, 1, R, S] and its rows' slots [B, R] (rows
    that do not see the `offset` reserved entries attend from slot `offset` on, as if there were none)."""
    orders = []
    for b in range(mask.shape[0]):
        base, rows = int(slots[b, 0]), mask.shape[2]
        firsts = [0 if seen else offset for seen in sees_reserved[b].tolist()]
        start = min(firsts)
        ancestors = [(torch.nonzero(row).flatten() + base).tolist() for row in mask[b, 0, :, base:]]
        shared: dict[tuple[int, int], list[int]] = {}
        alone: list[tuple[int, list[int]]] = []
        tails: list[list[int]] = []
        for r, (first, own) in enumerate(zip(firsts, ancestors)):
            seen = base - first + len(own)
            split = first + (seen - 1) // TAIL * TAIL  # its last block starts at this position of its order
            before = split - base  # its ancestors that fall before the split (a deep node), if positive
            tails.append(own[before:] if before > 0 else [*range(split, base), *own])
            if before <= 0 or own[:before] == list(range(base, split)):
                shared.setdefault((first, split), []).append(r)
            else:
                alone.append((r, [*range(first, base), *own[:before]]))
        groups = [_group(members, (first - start, split - start), tails, start, rows)
                  for (first, split), members in shared.items()]
        groups += [_group([r], torch.tensor(head) - start, tails, start, rows) for r, head in alone]
        end = max(base + rows, *(start + g.head[1] + TAIL for g in groups if isinstance(g.head, tuple)))
        orders.append(DecodeOrder(start, base + rows, end, rows, groups))
    return orders


def _group(members: list[int], head: tuple[int, int] | torch.Tensor, tails: list[list[int]], start: int,
           rows: int) -> RowGroup:
    seen = torch.arange(TAIL)[None] < torch.tensor([len(tails[r]) for r in members])[:, None]
    lo = head[1] + start if isinstance(head, tuple) else None
    if lo is not None and all(tails[r] == list(range(lo, lo + len(tails[r]))) for r in members):
        tail = None
    else:
        tail = torch.tensor([tails[r] + [tails[r][-1]] * (TAIL - len(tails[r])) for r in members]) - start
    return RowGroup(torch.tensor(members), head, tail, seen, members == list(range(rows)))


def exact_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, order: DecodeOrder, scale: float,
                    one_call: bool = True) -> torch.Tensor:
    """Attention of one sequence's verify rows q [1, H, R, d] over its cache in float32 (keys, values
    [KVH, S, d], S at least `order.end`, finite everywhere: `target.FloatKV`), each row bit for bit what
    the one-token decode at its position computes with this function (module docstring); returns [1, H, R, d]
    in q's dtype. `one_call` False (`rows_agree` failed): each row its own calls."""
    if not one_call and order.rows > 1:
        return torch.cat([exact_attention(q[:, :, r:r + 1], keys, values, _only(order, r), scale)
                          for r in range(order.rows)], 2)
    _, h, rows, d = q.shape
    kvh = keys.shape[0]
    g = h // kvh
    values = values[:, order.start:order.end]
    queries = _two_rows(q[0].float().view(kvh, g, rows, d)).mul_(scale)
    scores = torch.matmul(queries.reshape(kvh, -1, d), keys[:, order.start:order.end].transpose(-1, -2))
    scores = scores.view(kvh, g, queries.shape[2], -1)
    if len(order.groups) == 1 and order.groups[0].all_rows:
        return _group_attention(scores[:, :, :rows], values, order.groups[0]).reshape(1, h, rows, d).to(q.dtype)
    out = torch.empty(kvh, g, rows, d)
    for group in order.groups:
        out[:, :, group.rows] = _group_attention(scores[:, :, group.rows], values, group)
    return out.view(1, h, rows, d).to(q.dtype)


def _group_attention(scores: torch.Tensor, values: torch.Tensor, group: RowGroup) -> torch.Tensor:
    """One group's rows, their scores [KVH, g, n, keys]: softmax over (head keys, last block) and p @ v in those
    two parts, the last block a batched call with a row each; [KVH, g, n, d]."""
    kvh, g, n = scores.shape[:3]
    length = group.head_len
    if group.tail is None:  # head and last block side by side in slot order: a slice
        lo = group.head[0]
        mine = scores[..., lo:lo + length + TAIL]
        mine[..., length:].masked_fill_(~group.seen, float("-inf"))
        head_values, tail_values = values[:, lo:lo + length], values[:, None, lo + length:lo + length + TAIL]
    else:
        tail = scores.gather(-1, group.tail[None, None].expand(kvh, g, n, TAIL)).masked_fill_(~group.seen, float("-inf"))
        head = group.head
        if isinstance(head, tuple):
            head_scores, head_values = scores[..., head[0]:head[1]], values[:, head[0]:head[1]]
        else:
            head_scores, head_values = scores[..., head], values[:, head]
        mine, tail_values = torch.cat((head_scores, tail), -1), values[:, group.tail]  # [KVH, n, TAIL, d]
    probs = mine.softmax(-1)
    out = torch.matmul(probs[..., length:].transpose(1, 2), tail_values).transpose(1, 2)
    if length:
        head_probs = _two_rows(probs[..., :length])
        out = out + torch.matmul(head_probs.reshape(kvh, -1, length), head_values).view(kvh, g, -1, out.shape[-1])[:, :, :n]
    return out


def _two_rows(x: torch.Tensor) -> torch.Tensor:
    """x [KVH, g, n, ...] with one row doubled (n = 1 -> 2), so that a matmul sees at least 2 x g query rows,
    where its rounding no longer depends on how many (module docstring)."""
    return x if x.shape[2] > 1 else torch.cat((x, x), 2)


def _only(order: DecodeOrder, r: int) -> DecodeOrder:
    """The order of row r alone (its q sliced out: row index 0)."""
    for group in order.groups:
        hit = (group.rows == r).nonzero().flatten()
        if len(hit):
            i = int(hit[0])
            tail = None if group.tail is None else group.tail[i:i + 1]
            return DecodeOrder(order.start, order.filled, order.end, 1,
                               [RowGroup(torch.tensor([0]), group.head, tail, group.seen[i:i + 1], True)])
    raise AssertionError(f"row {r} is in no group")


@functools.cache
def rows_agree() -> bool:
    """Whether this machine's float32 matmuls have the properties `exact_attention` relies on (module
    docstring; probed once per process), on random inputs in the forms it calls them: scores of every row count from 2, over keys that
    start and end elsewhere, against one row doubled; p @ v over the same keys, every row count against one
    row doubled; a batched call against its elements alone."""
    generator = torch.Generator().manual_seed(0)
    kvh, g, d = 3, 3, 64

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).bfloat16().float()

    for length in (64, 576, 2112):
        keys, values = rand(kvh, length + 2 * TAIL, d), rand(kvh, length + 2 * TAIL, d)
        q = rand(kvh, g, 130, d)
        probs = torch.rand(kvh, g, 130, length, generator=generator)
        for n in (2, 3, 9, 17, 33, 72, 130):
            for r in (0, n - 1):
                alone = _two_rows(q[:, :, r:r + 1]).reshape(kvh, -1, d) @ keys[:, TAIL:TAIL + length].transpose(-1, -2)
                many = q[:, :, :n].reshape(kvh, -1, d) @ keys.transpose(-1, -2)
                if not torch.equal(alone.view(kvh, g, 2, -1)[:, :, 0], many.view(kvh, g, n, -1)[:, :, r, TAIL:TAIL + length]):
                    return False
                alone = _two_rows(probs[:, :, r:r + 1]).reshape(kvh, -1, length) @ values[:, :length]
                many = probs[:, :, :n].reshape(kvh, -1, length) @ values[:, :length]
                if not torch.equal(alone.view(kvh, g, 2, d)[:, :, 0], many.view(kvh, g, n, d)[:, :, r]):
                    return False
    tails, block = torch.rand(kvh, 72, g, TAIL, generator=generator), rand(kvh, 72, TAIL, d)
    batched = torch.matmul(tails, block)
    return all(torch.equal(torch.matmul(tails[:, r:r + 1], block[:, r:r + 1]), batched[:, r:r + 1]) for r in (0, 5, 71))
