"""Standard speculative sampling (SpS; Leviathan et al. 2023, Chen et al. 2023) with a small draft model.

The draft is any Hugging Face causal LM that shares the target's tokenizer (for Qwen3 targets the FlashHead
thesis pairs Qwen/Qwen3-0.6B). Each round it drafts a chain of K tokens with its own KV cache, one forward
per token; tokens it has not seen yet (last round's accepted drafts and bonus) are fed first in one pass.
A batch of sequences drafts together: each of those forwards runs once for all of them (`DraftRound`).
The draft model runs through its own Hugging Face code over keys/values buffers of ours (`BufferCache`), so that
with `--compile` its forwards are static-shape graphs like the other drafters' steps.
At temperature 0 drafts are the argmax; above it they are sampled and verified with their probabilities.
The draft's body and its output head run separately so the head's share of draft time is recorded
(`draft_head`), the quantity FlashHead attacks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from specbench_cli.core.acceptance import greedy_tokens
from specbench_cli.core.compiling import CompiledSteps
from specbench_cli.core.errors import UsageError
from specbench_cli.core.host_copy import to_device
from specbench_cli.core.kernels import linear, read_packed, released
from specbench_cli.core.method import DecodeState, Method
from specbench_cli.core.target import VerifyExtras
from specbench_cli.core.tree import DraftTree
from specbench_methods.checkpoints import CheckpointError, locate
from specbench_methods.layers import DraftKV, Slots, round_slots


EMBEDDING_FROM_TARGET = "specbench_embedding_from_target"  # config key of the project's own draft models


def load_draft_model(ref: str, target: torch.nn.Module, what: str) -> torch.nn.Module:
    """A causal LM from a folder or hub id, checked to speak the target's vocabulary, its linears reading packed
    weights on a CPU (`kernels.read_packed`).

    A folder whose config sets `specbench_embedding_from_target` (the drafters `train-drafter` makes from
    the target's first layers) ships no embedding or head: both are the target's, copied in here."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder = locate(ref, what)
    config_file = folder / "config.json"
    shared = config_file.exists() and bool(json.loads(config_file.read_text()).get(EMBEDDING_FROM_TARGET))
    verbosity = hf_logging.get_verbosity()
    if shared:
        hf_logging.set_verbosity_error()  # the embedding is missing from the file on purpose
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=target.dtype, attn_implementation="sdpa")
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{folder}: cannot load the {what} draft model ({str(err).splitlines()[0]})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if shared:
        for mine, theirs in ((model.get_input_embeddings(), target.get_input_embeddings()),
                             (model.get_output_embeddings(), target.get_output_embeddings())):
            if mine.weight.shape != theirs.weight.shape:
                raise CheckpointError(f"{config_file}: {EMBEDDING_FROM_TARGET} is set, but the draft's embedding "
                                      f"{tuple(mine.weight.shape)} differs from the target's {tuple(theirs.weight.shape)}")
            if released(theirs):
                raise RuntimeError("the target's plain weights were freed (kernels.keep_one_copy) before a draft "
                                   "model copied its embedding and head")
            with torch.no_grad():
                mine.weight.copy_(theirs.weight)
    rows = model.get_output_embeddings().weight.shape[0]
    if rows < target.config.vocab_size:
        raise CheckpointError(f"{folder}: the draft head has {rows} tokens, the target's vocabulary "
                              f"{target.config.vocab_size}; drafter and target must share a tokenizer")
    return read_packed(model.to(target.device).eval())


class SpS(CompiledSteps, Method):
    name = "sps"
    drafter_names = ("sps",)
    inherent_syncs = "one per round: the accepted length, read with the k draft tokens (fed back on the device)"
    reads_target_weights = True  # a draft that shares the target's embedding and head copies them (load_draft_model)
    FEED_ROWS = (1, 2, 8)  # compiled: a round's unseen tokens padded to one of these (a longer feed runs eager)

    @dataclass
    class Options:
        k: int = 6  # draft tokens per round; the FlashHead thesis' SpS setting (§4, K = 6)
        # Deferred final-token verification (FlashHead thesis §3.6.2): the round's last token is the root of
        # the next verify batch. false = the naive variant, a separate one-token target forward per round.
        deferred: bool = True
        RANGES = {"k": (1, 64)}  # --opt ranges, checked before any model loads

    def __init__(self, options: Options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        self.draft = load_draft_model(self.drafter_ref("sps"), model.model, "sps")
        self.vocab = model.model.config.vocab_size
        self.extra_forwards = not options.deferred
        self.shape = DraftShape.of(self.draft.config)

    @dataclass
    class Lane:
        # The draft model's keys/values of the tokens `cached` (every layer's, `DraftShape`), in order.
        kv: DraftKV = field(default_factory=DraftKV)
        known: list[int] = field(default_factory=list)  # `cached` but the last drafts fed back, when still unread
        root_logits: torch.Tensor | None = None  # deferred=false: the root's logits from its own forward
        fed_back: DraftTree | None = None  # the last round's drafts, all but the last in the cache after `known`

        @property
        def cached(self) -> list[int]:
            """The tokens whose KV is in the draft cache (reading the drafts fed back, which the round's accept
            has read already)."""
            if self.fed_back is not None:
                self.known, self.fed_back = self.known + self.fed_back.tokens[:-1], None
            return self.known

        @cached.setter
        def cached(self, tokens: list[int]) -> None:
            self.known, self.fed_back = tokens, None

    @property
    def device(self) -> torch.device:
        return self.draft.get_input_embeddings().weight.device

    def start(self, state: DecodeState) -> None:
        lane = self.lane(state)
        lane.kv, lane.cached = DraftKV().fixed(self.capacity), []

    def feed(self, ids: list[int], state: DecodeState) -> torch.Tensor:
        """Run the draft body over `ids` after the sequence's cached tokens; return the last hidden state [H] (what
        `propose` does for a batch of one)."""
        lane = self.lane(state)
        batch = DraftRound(self, [lane], [ids])
        hidden = batch.feed()
        batch.keep([lane], [None])
        return hidden[0]

    def head(self, hidden: torch.Tensor, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next draft token (a one-element tensor on the device) and, when sampling, its distribution over the
        target vocabulary."""
        if state.temperature <= 0:
            return self.greedy(hidden[None]), None
        probs = torch.softmax(self.logits(hidden[None])[0] / state.temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=state.generator), probs

    def heads(self, hidden: torch.Tensor, states: list[DecodeState]) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """`head` for a batch, hidden [B, H]: one head call for all rows, the tokens [B] left on the device; a
        sampled row draws from its own distribution with its own generator, one draw per step as alone. A batch of
        one is `head` itself (batch 1's arithmetic)."""
        if len(states) == 1:
            token, probs = self.head(hidden[0], states[0])
            return token, [probs]
        if all(s.temperature <= 0 for s in states):
            return self.greedy(hidden), [None] * len(states)
        logits = self.logits(hidden)
        draws, rows = [], []
        for row, s in zip(logits, states):
            if s.temperature <= 0:
                draws.append(greedy_tokens(row[None]))
                rows.append(None)
            else:
                rows.append(torch.softmax(row / s.temperature, dim=-1))
                draws.append(torch.multinomial(rows[-1], 1, generator=s.generator))
        return torch.cat(draws), rows

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """The draft head's top token [B] of each row of hidden [B, H] (the first of equal scores)."""
        return greedy_tokens(self.logits(hidden))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The draft head's float32 logits [B, V] over the target's vocabulary; compiled, a graph of its own."""
        return self.run_step("head", self._logits, hidden)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear(self.draft.get_output_embeddings(), hidden).float()[:, : self.vocab]

    @torch.inference_mode()
    def propose(self, states: list[DecodeState]) -> list[DraftTree]:
        """k draft tokens per sequence, each fed back to the draft model, every step one draft forward for the whole
        batch (`DraftRound`), after one forward over every sequence's unseen tokens (the prompt in a turn's first
        round, later the last round's accepted drafts and bonus)."""
        for state in states:
            self._rewind(state)
        lanes = [self.lane(s) for s in states]
        batch = DraftRound(self, lanes, [s.tokens[len(lane.cached):] for s, lane in zip(states, lanes)])
        hidden = batch.feed()
        steps: list[torch.Tensor] = []  # each step's tokens [B], fed back on the device
        rows: list[list[torch.Tensor | None]] = [[] for _ in states]
        for i in range(self.options.k):
            with states[0].timed("draft_head"):
                drafted, probs = self.heads(hidden, states)
            steps.append(drafted)
            for b, p in enumerate(probs):
                rows[b].append(p)
            if i + 1 < self.options.k:
                hidden = batch.step(drafted)
        drafts = torch.stack(steps, 1)  # left on the device: the round's accept reads them with the target's tokens
        trees = [DraftTree.chain(t, draft_probs=None if r[0] is None else torch.stack(r)) for t, r in zip(drafts, rows)]
        batch.keep(lanes, trees)
        return trees

    def extra_forward(self, state: DecodeState) -> None:
        """deferred=false: put the round's root (the last committed token) into the target's cache with a
        one-token forward of its own, as the naive scheme does, instead of feeding it first in the verify."""
        self.lane(state).root_logits = state.target.forward(state.tokens[-1:])[-1]

    def verify_extras(self, state: DecodeState, tree: DraftTree) -> VerifyExtras | None:
        lane = self.lane(state)
        root_logits, lane.root_logits = lane.root_logits, None
        return None if root_logits is None else VerifyExtras(root_logits=root_logits)

    def _rewind(self, state: DecodeState) -> None:
        """Drop cached drafts the target rejected: keep the longest prefix shared with the committed tokens."""
        keep, tokens = 0, state.tokens
        for a, b in zip(self.lane(state).cached, tokens):
            if a != b:
                break
            keep += 1
        self.truncate(state, min(keep, len(tokens) - 1))  # the root is always fed again to get the next hidden state

    def truncate(self, state: DecodeState, keep: int) -> None:
        """Keep only the first `keep` tokens of the sequence's draft cache (what lies past them is overwritten)."""
        lane = self.lane(state)
        if keep < len(lane.cached):
            lane.kv.length = keep
            lane.cached = lane.cached[:keep]

    # ------------------------------------------------------------------------------------ the draft's forward
    def forward(self, ids: torch.Tensor, starts: list[int], slots: Slots) -> torch.Tensor:
        """The draft body over ids [B, T], row b's tokens at positions starts[b]... (which are also its columns in
        the round's buffers `slots`): the hidden states [B, T, H]. Eager, each layer writes its keys into the
        buffers and attends over them in place; compiled (T one of `FEED_ROWS`, buffers of the planned capacity), one
        graph reads the buffers whole beside its own keys, and those are written after it."""
        begin = to_device(starts, ids.device)
        if self.graphs is not None and ids.shape[1] in self.FEED_ROWS and slots.k.shape[-2] == self.capacity:
            hidden, k, v = self.graphs("forward", self._apart_forward, ids, begin, slots.k, slots.v)
            write_rows(slots, starts, begin, k, v)
            return hidden
        cache = BufferCache(self.shape.kv_heads, slots, starts, begin)
        width = max(starts) + ids.shape[1]
        alone = len(starts) == 1 and (ids.shape[1] == 1 or starts[0] == 0)  # transformers' own choice: no mask
        mask = None if alone and self.shape.window_covers(width) else self.shape.masks(begin, ids.shape[1], width)
        return self._body(ids, begin, cache, mask)

    def _apart_forward(self, ids: torch.Tensor, begin: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """`forward` as a compiled graph runs it: over the whole buffers, returning the new keys/values [B, layers x
        kv heads, T, d] for the host to write."""
        cache = BufferCache(self.shape.kv_heads, Slots(k, v, 0), None, begin)
        hidden = self._body(ids, begin, cache, self.shape.masks(begin, ids.shape[1], k.shape[-2], apart=True))
        return hidden, torch.cat([k for k, _ in cache.own], 1), torch.cat([v for _, v in cache.own], 1)

    def _body(self, ids: torch.Tensor, begin: torch.Tensor, cache: BufferCache, mask) -> torch.Tensor:
        positions = begin[:, None] + torch.arange(ids.shape[1], device=ids.device)
        return self.draft.base_model(input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=cache,
                                     use_cache=True).last_hidden_state

    # ------------------------------------------------------------------------------------ compiled
    def round_room(self) -> int:
        return max(self.FEED_ROWS) + self.options.k  # a padded feed, then the k - 1 drafts fed back

    @torch.inference_mode()
    def warm_steps(self, batch: int) -> None:
        """A forward of each padded feed size over zero buffers (a draft step is a feed of one row), and the head."""
        like = self.shape.like(self.draft)
        slots = Slots(*(like.new_zeros(batch, like.shape[0], self.capacity, like.shape[2]) for _ in "kv"), 0)
        for rows in self.FEED_ROWS:
            hidden = self.forward(torch.zeros(batch, rows, dtype=torch.long, device=self.device), [0] * batch, slots)
        self.greedy(hidden[:, -1])


@dataclass(frozen=True)
class DraftShape:
    """What the draft model's cache holds per token and which keys each layer sees: its layers' keys/values stacked
    as one [layers x kv heads, T, d] per sequence (`DraftKV`), and, for a model with sliding-window layers, the
    window and which layers use it (by their `layer_types` name)."""

    layers: int
    kv_heads: int
    head_dim: int
    window: int | None  # the sliding window of the layers that slide; None: every layer sees the whole sequence
    mixed: bool  # some layers slide and others do not: the model takes a mask per layer type

    @classmethod
    def of(cls, config) -> DraftShape:
        kinds = [type(layer).__name__ for layer in DynamicCache(config=config).layers]
        sliding = [k != "DynamicLayer" for k in kinds]
        if any(sliding) and "sliding_attention" not in (getattr(config, "layer_types", None) or []) and not all(sliding):
            raise UsageError("the sps draft model mixes sliding-window and full layers without naming them "
                             "(config.layer_types); it is not supported")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(len(kinds), config.num_key_value_heads, head_dim, config.sliding_window if any(sliding) else None,
                   any(sliding) and not all(sliding))

    def like(self, draft: torch.nn.Module) -> torch.Tensor:
        """An empty [layers x kv heads, 0, d] of the draft's dtype and device (`DraftKV`'s and `round_slots`' `like`)."""
        weight = draft.get_input_embeddings().weight
        return weight.new_empty(self.layers * self.kv_heads, 0, self.head_dim)

    def window_covers(self, width: int) -> bool:
        """Whether every query over `width` keys sees them all (no layer's window cuts them)."""
        return self.window is None or width <= self.window

    def masks(self, begin: torch.Tensor, rows: int, width: int, apart: bool = False):
        """What each of `rows` queries of row b (at positions begin[b]...) may attend to, bool [B, 1, rows, keys]:
        the buffers' first `width` columns, its own keys written in them; `apart` (a compiled forward): the `width`
        columns of the buffers, then its own keys beside them (`BufferCache`). A model with sliding layers gets a
        mask per layer type."""
        full = self._mask(begin, rows, width, apart, None)
        if self.window is None:
            return full
        window = self._mask(begin, rows, width, apart, self.window)
        return {"full_attention": full, "sliding_attention": window} if self.mixed else window

    @staticmethod
    def _mask(begin: torch.Tensor, rows: int, width: int, apart: bool, window: int | None) -> torch.Tensor:
        device = begin.device
        query = begin[:, None, None] + torch.arange(rows, device=device)[None, :, None]  # [B, rows, 1]: positions
        key = torch.arange(width, device=device)[None, None]  # a column's position is its index
        if apart:  # the cached columns, then the call's own keys at the queries' positions
            own = query.transpose(1, 2)  # [B, 1, rows]
            seen = torch.cat(((key < begin[:, None, None]).expand(-1, rows, -1), own <= query), -1)
            key = torch.cat((key.expand(begin.shape[0], 1, -1), own), -1)
        else:
            seen = key <= query
        if window is not None:
            seen = seen & (key > query - window)
        return seen[:, None]


class BufferCache:
    """The draft model's cache for one forward, as transformers' attention layers use it (`update` per layer): the
    round's buffers [B, layers x kv heads, C, d], layer i its slice of heads, row b's tokens at columns (= positions)
    from `starts[b]`. Eager (starts given), a layer writes its new keys there and attends over the buffers up to
    the widest row; compiled (starts None), it leaves the buffers untouched and attends over them whole beside its
    own keys, which it keeps (`own`) for the host to write after the graph (`write_rows`): no write into a graph's
    input, which inductor would turn into a copy of the buffers."""

    def __init__(self, kv_heads: int, slots: Slots, starts: list[int] | None, begin: torch.Tensor) -> None:
        self.kv_heads, self.slots, self.starts, self.begin = kv_heads, slots, starts, begin
        self.own: list[tuple[torch.Tensor, torch.Tensor]] = []

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int, *args, **kwargs):
        part = slice(layer * self.kv_heads, (layer + 1) * self.kv_heads)
        k, v = self.slots.k[:, part], self.slots.v[:, part]
        if self.starts is None:
            self.own.append((keys, values))
            return torch.cat((k, keys), 2), torch.cat((v, values), 2)
        write_rows(Slots(k, v, 0), self.starts, self.begin, keys, values)
        width = max(self.starts) + keys.shape[2]
        return k[:, :, :width], v[:, :, :width]

    # What transformers asks to build its own mask, given none (`SpS.forward`: a lone sequence, as before a cache
    # of its own): the keys it attends to are its cached tokens and its own.
    def get_query_offset(self, layer: int = 0) -> int:
        return self.starts[0]

    def get_mask_sizes(self, query_length: int, layer: int = 0) -> tuple[int, int]:
        return self.starts[0] + query_length, 0

    def get_seq_length(self, layer: int = 0) -> int:
        return self.starts[0]


def write_rows(slots: Slots, starts: list[int], begin: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Write k, v [B, heads, T, d] into the buffers at row b's columns starts[b]... (`begin`: the same on the
    device): a slice when the rows start together, else one indexed write."""
    T = k.shape[2]
    if len(set(starts)) == 1:
        Slots(slots.k, slots.v, starts[0]).write(k, v)
        return
    rows = torch.arange(len(starts), device=begin.device)[:, None]
    columns = begin[:, None] + torch.arange(T, device=begin.device)
    slots.k[rows, :, columns] = k.transpose(1, 2)
    slots.v[rows, :, columns] = v.transpose(1, 2)


class DraftRound:
    """One round's draft forwards for the sequences drafting together. The buffers are `round_slots`' over their
    caches: a lone sequence's own (it writes in place), else a copy of every cache, each row from column 0. Row
    b's tokens keep their positions as columns: its unseen tokens (padded to the longest, then, compiled, to a
    `FEED_ROWS` size, with its last token), then one column per draft step. A padding query sees its own row up to
    itself, so no attention row is all masked and no padding key or value is NaN; padding columns lie past the
    row's tokens, where the next write or the mask hides them."""

    def __init__(self, sps: SpS, lanes: list, feeds: list[list[int]]) -> None:
        self.sps, self.feeds, self.device = sps, feeds, sps.device
        self.first = [lane.kv.length for lane in lanes]  # each row's cached tokens
        self.starts = list(self.first)  # where each row's next forward writes
        longest = max(len(f) for f in feeds)
        fits = [n for n in sps.FEED_ROWS if n >= longest] if sps.graphs is not None else []
        self.rows = fits[0] if fits else longest
        self.slots, _ = round_slots([lane.kv for lane in lanes], self.rows + sps.options.k,
                                    sps.shape.like(sps.draft))

    def feed(self) -> torch.Tensor:
        """Every row's unseen tokens in one forward; the hidden states [B, H] after each row's last one."""
        ids = to_device([f + [f[-1]] * (self.rows - len(f)) for f in self.feeds], self.device)
        hidden = self.sps.forward(ids, self.starts, self.slots)
        self.starts = [s + len(f) for s, f in zip(self.starts, self.feeds)]
        if all(len(f) == self.rows for f in self.feeds):
            return hidden[:, -1]
        last = to_device([len(f) - 1 for f in self.feeds], self.device)
        return hidden[torch.arange(len(self.feeds), device=self.device), last]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One draft token per row (tokens [B] on the device), in one forward; the hidden states [B, H] after them."""
        hidden = self.sps.forward(tokens[:, None], self.starts, self.slots)[:, -1]
        self.starts = [s + 1 for s in self.starts]
        return hidden

    def keep(self, lanes: list, drafts: list[DraftTree | None]) -> None:
        """Each lane's cache now holds its cached tokens, its unseen ones and the drafts fed back (all of a tree
        but its last token): a lone sequence's are in place, a batch's rows are copied back."""
        for b, (lane, fed, tree) in enumerate(zip(lanes, self.feeds, drafts)):
            assert self.starts[b] == self.first[b] + len(fed) + (0 if tree is None else len(tree) - 1)
            if len(lanes) == 1:
                lane.kv.length = self.starts[b]
            else:
                columns = slice(self.first[b], self.starts[b])
                lane.kv.append(self.slots.k[b, :, columns], self.slots.v[b, :, columns])
            lane.cached = lane.cached + fed
            lane.fed_back = tree
