"""The target: the verifying model over one preallocated KV cache of one or more sequences.

`TargetModel` holds the model, the cache and the one forward, `run(rows)`, over the rows of any sequences in
consecutive slots; each sequence is a `Target`: prefill(ids) -> logits of the next token; verify(root, tree) ->
logits of every tree node in one forward with an ancestor mask and depth-based positions; commit(path) -> the
accepted path's cache entries moved into place; forward(tokens) -> a plain append, for methods that need an extra
target forward. `TargetModel.verify` verifies many sequences' trees in one forward (the loop's batch).

The forward is ours, run over the model's own modules (embeddings, norms, projections, rotary, MLPs, head),
so that the cache can be static, as in gpt-fast: one buffer per device, [layers, 2, slots, kv heads, capacity,
head dim], allocated once and grown only when a prompt needs more. A forward writes its rows in place at the
slots after each sequence's committed length and attends through a boolean mask:

- eager: to the valid prefix and its own rows only (a slice of the buffer; a batch's trees padded to the largest);
- compiled (`compile=...`): to the whole buffer, every slot, with rows padded to a bucket size, so that every
  forward of a bucket has the same shapes and one compiled graph (a CUDA graph under "reduce-overhead")
  serves it. The graph only reads the cache: its rows' keys and values come out of it and the host writes
  them (`RowsApart`). Padding rows see only themselves and land past the committed length, where nothing
  reads them.

The decoder is written once (`forward.Decoder`) over a backend (`backends.Backend`) that `choose` picks at
start-up from the device, the dtype, the options and what the start-up probes find (`probes`): the row-wise
work (GEMMs, MLPs, head), attention over the cache and, where it can, every decoder layer in one call. The
backend says what ran (`TargetModel.attention` and `.layers`, run.json's `attention` and `layers`). A prompt's
forward always runs its rows in one call with plain causal SDPA (`TargetModel._prefill`).

The extension points, all generic (this package names no method):
- `capture(layers)`: a drafter that reads target features asks for decoder layers' outputs; every forward
  then leaves them in `captured`.
- `VerifyExtras` on a verify: side rows (inputs given as embeddings that see the prefix, the tree nodes
  they are allowed and themselves, and that nothing attends to) whose hidden states come back beside the
  tree's logits, and `root_logits` when an earlier `forward` already cached the root.
- `reserve(n)`: entries at the front of the cache that only side rows see (a learned soft prompt).
- `forward(tokens)`: a plain append outside verify, for a method that needs target forwards of its own.

Batch-invariant (`invariant=True`, eager): every row of a verify is computed bit for bit as a one-token decode
computes it — GEMMs whose rounding does not depend on the row count (`backends.KernelRows` with a lone row padded
where the kernels round it otherwise, `PaddedOneRow`, or `RowBlocks`), attention one row at a time over the keys
it sees, in the order that decode reads them (the row kernel `core.row_attention`, `cpu.RowKernel`; where it is
not built `attention.exact_attention` on the float copy `cache.FloatKV`, `backends.ExactOrders`) — so that in
bf16 a method's greedy output equals plain one-token decoding's. The plain target attends with the row kernel
too (a decode's one row as PyTorch operators was a large share of a CPU decode). Wherever the row kernel attends,
every decoder layer runs in one C++ call (`core.decoder_layers`, `cpu.OneCall`: the same GEMMs and kernel, the
glue between them row by row). Where attention runs through SDPA instead (float32, CUDA: each row its own
problem over a common span, `backends.PerRowSDPA`) a tree's rows are not exact, and its accepted path is
verified again as a chain (`verify_paths`, `exact_trees` False).
"""

from specbench_cli.core.target.backends import ROW_BLOCK, Backend
from specbench_cli.core.target.cache import FloatKV, StaticKV
from specbench_cli.core.target.choose import choose
from specbench_cli.core.target.compiled import DEFAULT_BUCKETS, RowsApart
from specbench_cli.core.target.forward import rotate
from specbench_cli.core.target.model import ROOM, SUPPORTED, Target, TargetModel, check_supported
from specbench_cli.core.target.rows import Layout, Out, Rows, SideTokens, VerifyExtras, unpack

__all__ = ["DEFAULT_BUCKETS", "ROOM", "ROW_BLOCK", "SUPPORTED", "Backend", "FloatKV", "Layout", "Out", "Rows",
           "RowsApart", "SideTokens", "StaticKV", "Target", "TargetModel", "VerifyExtras", "check_supported",
           "choose", "rotate", "unpack"]
