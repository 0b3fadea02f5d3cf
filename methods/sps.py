"""Standard speculative sampling (SpS; Leviathan et al. 2023, Chen et al. 2023) with a small draft model.

The draft is any Hugging Face causal LM that shares the target's tokenizer (for Qwen3 targets the FlashHead
thesis pairs Qwen/Qwen3-0.6B). Each round it drafts a chain of K tokens with its own KV cache, one forward
per token; tokens it has not seen yet (last round's accepted drafts and bonus) are fed first in one pass.
A batch of sequences drafts together: each of those forwards runs once for all of them, over one padded
cache (`DraftBatch`).
At temperature 0 drafts are the argmax; above it they are sampled and verified with their probabilities.
The draft's body and its output head run separately so the head's share of draft time is recorded
(`draft_head`), the quantity FlashHead attacks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from specbench_cli.core.errors import UsageError
from specbench_cli.core.kernels import linear, read_packed, released
from specbench_cli.core.host_copy import to_device
from specbench_cli.core.method import DecodeState, Method
from specbench_methods.checkpoints import CheckpointError, locate
from specbench_cli.core.target import VerifyExtras
from specbench_cli.core.tree import DraftTree


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


class SpS(Method):
    name = "sps"
    drafter_names = ("sps",)
    inherent_syncs = "one per round: the accepted length, read with the k draft tokens (fed back on the device)"
    reads_target_weights = True  # a draft that shares the target's embedding and head copies them (load_draft_model)

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

    @dataclass
    class Lane:
        # The draft model's cache holding the sequence's tokens `cached`: its own (batch 1, exactly `cached` in
        # order: `segments` None), or the cache of the batch it last drafted in, whose row `row` holds them in the
        # runs `segments` ((first column, count), in order) among padding and rejected drafts.
        cache: DynamicCache | None = None
        known: list[int] = field(default_factory=list)  # `cached` but the last drafts fed back, when still unread
        row: int = 0
        segments: list[tuple[int, int]] | None = None
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

    def serve(self, lanes: int) -> None:
        if lanes > 1:  # a batch's cache has padding and holes that a sliding window would count as tokens
            kinds = {type(layer).__name__ for layer in DynamicCache(config=self.draft.config).layers}
            if kinds != {"DynamicLayer"}:
                raise UsageError(f"{self.name} at --batch-size > 1 needs a draft model whose every layer attends to "
                                 f"the whole sequence; this one's cache has {', '.join(sorted(kinds))} layers")

    def start(self, state: DecodeState) -> None:
        lane = self.lane(state)
        lane.cache, lane.cached, lane.row, lane.segments = DynamicCache(config=self.draft.config), [], 0, None

    def finish(self, state: DecodeState) -> None:
        self.lane(state).cache = None  # a batch's cache goes once no sequence holds it

    def feed(self, ids: list[int], state: DecodeState) -> torch.Tensor:
        """Run the draft body over `ids` after the cached tokens of a sequence with its own cache; return the last
        hidden state [H] (what `propose` does for a batch of one)."""
        lane, device = self.lane(state), state.target.device
        assert lane.segments is None, "feed() extends a sequence's own cache"
        positions = torch.arange(len(lane.cached), len(lane.cached) + len(ids), device=device)[None]
        out = self.draft.base_model(input_ids=to_device([ids], device), position_ids=positions,
                                    past_key_values=lane.cache, use_cache=True)
        lane.cached += ids
        return out.last_hidden_state[0, -1]

    def head(self, hidden: torch.Tensor, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next draft token (a one-element tensor on the device) and, when sampling, its distribution over the
        target vocabulary."""
        logits = linear(self.draft.get_output_embeddings(), hidden[None])[0].float()[: self.vocab]
        if state.temperature <= 0:
            return logits.argmax()[None], None
        probs = torch.softmax(logits / state.temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=state.generator), probs

    def heads(self, hidden: torch.Tensor, states: list[DecodeState]) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """`head` for a batch, hidden [B, H]: one head call for all rows, the tokens [B] left on the device; a
        sampled row draws from its own distribution with its own generator, one draw per step as alone. A batch of
        one is `head` itself (batch 1's arithmetic)."""
        if len(states) == 1:
            token, probs = self.head(hidden[0], states[0])
            return token, [probs]
        logits = linear(self.draft.get_output_embeddings(), hidden).float()[:, : self.vocab]
        if all(s.temperature <= 0 for s in states):
            return logits.argmax(-1), [None] * len(states)
        draws, rows = [], []
        for row, s in zip(logits, states):
            if s.temperature <= 0:
                draws.append(row.argmax()[None])
                rows.append(None)
            else:
                rows.append(torch.softmax(row / s.temperature, dim=-1))
                draws.append(torch.multinomial(rows[-1], 1, generator=s.generator))
        return torch.cat(draws), rows

    @torch.inference_mode()
    def propose(self, states: list[DecodeState]) -> list[DraftTree]:
        """k draft tokens per sequence, each fed back to the draft model, every step one draft forward for the whole
        batch (`DraftBatch`), after one forward over every sequence's unseen tokens (the prompt in a turn's first
        round, later the last round's accepted drafts and bonus)."""
        for state in states:
            self._rewind(state)
        lanes = [self.lane(s) for s in states]
        batch = DraftBatch(self.draft, lanes, [s.tokens[len(lane.cached):] for s, lane in zip(states, lanes)],
                           states[0].target.device)
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
        """Keep only the first `keep` tokens of the sequence's draft cache."""
        lane = self.lane(state)
        if keep < len(lane.cached):
            if lane.segments is None:
                lane.cache.crop(keep - len(lane.cached))  # transformers 5: a negative count removes that many
            else:  # a batch's cache, which other rows read too: forget the columns, the next round gathers
                kept, left = [], keep
                for first, count in lane.segments:
                    if left > 0:
                        kept.append((first, min(count, left)))
                    left -= count
                lane.segments = kept
            lane.cached = lane.cached[:keep]


class DraftBatch:
    """One round's draft cache for the sequences drafting together, run through the draft model as Hugging Face
    runs a padded batch: per-row `position_ids` and a 2-D `attention_mask` over the cache's columns.

    Row b, columns left to right: padding, its cached tokens (gathered from wherever its lane keeps them, so
    that they end where the cache ends), this round's unseen tokens and padding up to the longest row's (right
    padding: a padding query still sees its own row's tokens, so no attention row is all masked and no padding
    key or value is NaN), then one column per draft step. Padding holds finite values and is masked out, and each
    real token has its own position, so a row attends to the keys, at the positions, it has alone. A sequence
    alone with its own cache runs in it in place with no mask: batch 1's arithmetic, unchanged."""

    def __init__(self, draft: torch.nn.Module, lanes: list, feeds: list[list[int]], device: torch.device) -> None:
        self.draft, self.device, self.feeds = draft, device, feeds
        self.kept = [len(lane.cached) for lane in lanes]
        self.width = max(self.kept)  # W: the cached columns, every row padded to the longest
        self.longest = max(len(f) for f in feeds)  # N: the unseen tokens, every row padded to the longest
        self.steps = 0
        alone = len(lanes) == 1 and lanes[0].segments is None
        self.cache = lanes[0].cache if alone else self._gathered(lanes)
        self.mask = None
        if any(n < self.width for n in self.kept) or any(len(f) < self.longest for f in feeds):
            columns = torch.arange(self.width + self.longest, device=device)[None]
            first = to_device([self.width - n for n in self.kept], device)[:, None]
            end = to_device([self.width + len(f) for f in feeds], device)[:, None]
            self.mask = (columns >= first) & (columns < end)  # [B, W + N], True: a real token

    def _gathered(self, lanes: list) -> DynamicCache:
        """A new cache, [B, heads, W, d] per layer, row b ending with lane b's cached tokens: per layer one gather
        from each cache the lanes come from (one in a steady batch); a row with nothing cached is all padding."""
        cache = DynamicCache(config=self.draft.config)
        W, device = self.width, self.device
        if W > 0:
            runs = [lane.segments if lane.segments is not None else [(0, n)] for lane, n in zip(lanes, self.kept)]
            S = max(len(r) for r in runs)
            first = to_device([[f for f, _ in r] + [0] * (S - len(r)) for r in runs], device)  # [B, S]
            count = to_device([[c for _, c in r] + [0] * (S - len(r)) for r in runs], device)
            before = torch.cumsum(count, 1) - count  # the row's tokens in its earlier runs
            index = (torch.arange(W, device=device)[None]
                     - to_device([W - n for n in self.kept], device)[:, None])  # token index; < 0: padding
            column = torch.zeros_like(index)  # padding reads column 0: finite, and masked out
            for s in range(S):
                start, size = before[:, s:s + 1], count[:, s:s + 1]
                column = torch.where((index >= start) & (index < start + size), first[:, s:s + 1] + index - start,
                                     column)
            sources: dict[int, list[int]] = {}
            for b, (lane, n) in enumerate(zip(lanes, self.kept)):
                if n:
                    sources.setdefault(id(lane.cache), []).append(b)
            groups = []
            for members in sources.values():
                if len(sources) == 1:  # every row reads this source; rows with nothing cached read its row 0
                    members = list(range(len(lanes)))
                rows = to_device([lanes[b].row if self.kept[b] else 0 for b in members], device)
                groups.append((lanes[next(b for b in members if self.kept[b])].cache, members, rows))
            for i, layer in enumerate(cache.layers):
                kv = []
                for kind in ("keys", "values"):
                    out = None
                    for source, members, rows in groups:
                        data = getattr(source.layers[i], kind).transpose(1, 2)  # [B0, T0, heads, d]
                        if len(groups) == 1:
                            out = data[rows[:, None], column]
                        else:
                            if out is None:
                                out = data.new_zeros(len(lanes), W, *data.shape[2:])
                            picked = to_device(members, device)
                            out[picked] = data[rows[:, None], column[picked]]
                    kv.append(out.transpose(1, 2))  # [B, heads, W, d]
                layer.lazy_initialization(*kv)
                layer.keys, layer.values = kv
        for b, (lane, n) in enumerate(zip(lanes, self.kept)):  # the old caches go once no lane holds them
            lane.cache, lane.row, lane.segments = cache, b, [(W - n, n)]
        return cache

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.draft.base_model(input_ids=ids, position_ids=positions, attention_mask=self.mask,
                                     past_key_values=self.cache, use_cache=True).last_hidden_state

    def feed(self) -> torch.Tensor:
        """Every row's unseen tokens in one forward; the hidden states [B, H] after each row's last one."""
        N, device = self.longest, self.device
        ids = to_device([f + [f[-1]] * (N - len(f)) for f in self.feeds], device)
        positions = to_device([list(range(n, n + N)) for n in self.kept], device)
        hidden = self._forward(ids, positions)
        if self.mask is None:  # every row ends at the last column
            return hidden[:, -1]
        last = to_device([len(f) - 1 for f in self.feeds], device)
        return hidden[torch.arange(len(self.feeds), device=device), last]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One draft token per row (tokens [B] on the device), in one forward; the hidden states [B, H] after them."""
        device = self.device
        if self.mask is not None:
            self.mask = torch.cat((self.mask, self.mask.new_ones(tokens.shape[0], 1)), 1)
        positions = to_device([[n + len(f) + self.steps] for n, f in zip(self.kept, self.feeds)], device)
        self.steps += 1
        return self._forward(tokens[:, None], positions)[:, -1]

    def keep(self, lanes: list, drafts: list[DraftTree]) -> None:
        """Each lane's tokens are now its cached ones, its unseen ones and the drafts fed back (all of `drafts` but
        the last), in its row."""
        W, N = self.width, self.longest
        for b, (lane, n, fed, tree) in enumerate(zip(lanes, self.kept, self.feeds, drafts)):
            assert len(tree) - 1 == self.steps
            lane.cache, lane.row = self.cache, b
            lane.cached = lane.cached + fed
            lane.fed_back = tree
            if len(lanes) == 1:  # W = n and N = len(fed): the cache is the row's, in order
                lane.segments = None
            elif len(fed) == N:
                lane.segments = [(W - n, n + N + self.steps)]
            else:
                lane.segments = [(W - n, n + len(fed)), (W + N, self.steps)]
