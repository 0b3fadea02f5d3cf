"""suffix: SuffixDecoding (Oliaro et al.; reference snowflakedb/ArcticInference `csrc/suffix_decoding`).

Two suffix trees answer each round: a local one over this request's prompt + output, and a global one
over the outputs of every earlier request in the run (and this one's). A tree of depth D counts, for
every substring of length <= D, how many times it occurs. To draft, the last `match_len` tokens are
matched for match_len = 1, 2, ... (the longest match is never tried, as in the reference); from the
matched node the draft follows the most frequent children, a child's probability being
count(child) / count(node) times its parent's; tokens below `min_token_prob` are not drafted. The draft
with the highest score (sum of probabilities) wins, the global tree only if strictly better.

We keep the trees implicitly: a node is the set of positions where its substring ends, so a node's count
is the size of that set and its children are the tokens that follow those positions. This gives the
reference's counts exactly (a depth-truncated suffix tree counts substring occurrences) with only the token
arrays in memory. Ties between equally frequent children are broken as the reference breaks them: it keeps a
node's children in one list ordered by count and drafts the first, and where it files a child depends on the
order the child's occurrences arrived (`sibling_order`); our stores hold the sequences in the order they were
appended, which is that order at batch 1 (at batch > 1 the reference interleaves the in-flight requests' steps,
which a store of whole sequences does not keep, so a tie there may go otherwise).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from specbench_cli.core.method import DecodeState, Method
from specbench_cli.core.tree import DraftTree

SEPARATOR = -1


@dataclass
class SuffixDraft:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # index into tokens, -1 = the matched context
    probs: list[float] = field(default_factory=list)
    match_len: int = 0

    @property
    def score(self) -> float:
        """The sum of the probabilities, accumulated in float32 as the reference's `Draft.score += prob` is (so a
        tie between two drafts, or two match lengths, is broken on the same side)."""
        return float(np.cumsum(np.asarray(self.probs, dtype=np.float32))[-1]) if self.probs else 0.0

    def truncated(self, n: int, match_len: int) -> SuffixDraft:
        return SuffixDraft(self.tokens[:n], self.parents[:n], self.probs[:n], match_len)

    def tree(self) -> DraftTree:
        return DraftTree(self.tokens, [p + 1 for p in self.parents])


class TokenStore:
    """Sequences of token ids in one growable array, separated by SEPARATOR; the last one is open."""

    def __init__(self) -> None:
        self._buf = np.empty(1024, dtype=np.int64)
        self.size = 0

    def new_sequence(self) -> None:
        if self.size:
            self.extend([SEPARATOR])

    def extend(self, tokens: list[int]) -> None:
        need = self.size + len(tokens)
        if need > len(self._buf):
            self._buf = np.concatenate([self._buf, np.empty(max(need, 2 * len(self._buf)), dtype=np.int64)])
        self._buf[self.size:need] = tokens
        self.size = need

    @property
    def data(self) -> np.ndarray:
        return self._buf[: self.size]


class Joined:
    """Several stores read as one, each its own sequence (a lookup reads only `data`)."""

    def __init__(self, stores: list[TokenStore]) -> None:
        self.stores = stores

    @property
    def data(self) -> np.ndarray:
        return np.concatenate([part for store in self.stores for part in (store.data, [SEPARATOR])])


@dataclass
class SpecParams:
    """SuffixDecoding's speculation knobs (HVD seed Table 7; ArcticInference's vLLM defaults)."""

    max_depth: int = 64
    max_spec_tokens: int = 64
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    tree: bool = True
    # --opt ranges, checked before any model loads: (low, high), None = unbounded. Offsets may be negative
    # (ArcticInference's max_spec_offset); a factor past 64 or a depth past 1024 no longer limits anything.
    RANGES = {"max_depth": (1, 1024), "max_spec_tokens": (1, 1024), "max_spec_factor": (0, 64),
              "max_spec_offset": (-1024, 1024), "min_token_prob": (0, 1)}

    def cap(self, match_len: int) -> int:
        """Draft tokens allowed for a match of this length; a tree path cannot go below max_depth."""
        allowed = min(self.max_spec_tokens, int(match_len * self.max_spec_factor + self.max_spec_offset + 1e-6))
        return max(0, min(allowed, self.max_depth - match_len))


def speculate(store: TokenStore, pattern: list[int], params: SpecParams) -> SuffixDraft:
    """The best draft over all match lengths 1 .. len(pattern)-1 in one tree."""
    data = store.data
    pattern = pattern[-params.max_depth:]
    ends = np.flatnonzero(data == pattern[-1]) if pattern else np.empty(0, dtype=np.int64)
    caps = [params.cap(m) for m in range(len(pattern))]
    best, cached, cached_size = SuffixDraft(), SuffixDraft(), -1
    for m in range(1, len(pattern)):
        if m > 1:  # keep the ends whose substring also matches one more token to the left
            ok = ends >= m - 1
            ends = ends[ok]
            ends = ends[data[ends - (m - 1)] == pattern[-m]]
        if ends.size == 0:
            break
        if ends.size != cached_size:  # a new node; same size means the same set, so the same draft
            limit = max(caps[m:])
            grow = _grow_tree if params.tree else _grow_path
            cached, cached_size = grow(data, ends, limit, params.min_token_prob), ends.size
        draft = cached.truncated(caps[m], m)
        if draft.score >= best.score:
            best = draft
    return best


def _children(data: np.ndarray, ends: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(token, end positions of the child) for every child of the node ending at `ends`, in the reference's
    sibling order: by count, ties as `sibling_order` files them."""
    nxt = ends + 1
    nxt = nxt[nxt < len(data)]
    vals = data[nxt]
    keep = vals != SEPARATOR
    nxt, vals = nxt[keep], vals[keep]
    order = np.argsort(vals, kind="stable")
    vals, nxt = vals[order], nxt[order]
    tokens, starts = np.unique(vals, return_index=True)
    bounds = [*starts[1:], len(vals)]
    kids = {int(t): nxt[s:e] for t, s, e in zip(tokens, starts, bounds)}
    counts = sorted((len(k) for k in kids.values()), reverse=True)
    if all(a != b for a, b in zip(counts, counts[1:])):  # no tie: the order is the counts'
        return sorted(kids.items(), key=lambda kid: -kid[1].size)
    return [(t, kids[t]) for t in sibling_order(data[np.sort(nxt)].tolist())]


def sibling_order(arrivals: list[int]) -> list[int]:
    """The order ArcticInference keeps a node's children in, given the child tokens of the node's occurrences in
    the order they were appended (csrc/suffix_decoding/suffix_tree.cc, `_increment_count` and
    `_insert_into_siblings_after`: children sorted by count; a new child joins at the tail; a child whose count
    grows from c moves to the tail of the count-(c+1) children, unless it was the first of the count-c ones, in
    which case it moves to their head)."""
    order: list[int] = []
    count: dict[int, int] = {}
    for token in arrivals:
        c = count.get(token, 0)
        if c == 0:
            order.append(token)
        else:
            i = order.index(token)
            if i > 0 and count[order[i - 1]] <= c + 1:
                before = count[order[i - 1]]  # c: it was inside its group; c + 1: it led it
                order.pop(i)
                j = next((k for k, t in enumerate(order) if count[t] <= before), len(order))
                order.insert(j, token)
        count[token] = c + 1
    return order


# The reference computes probabilities in float32 (suffix_tree.cc: `float prob`, `static_cast<float>(count) /
# node->count` on a path, `prob * count / static_cast<float>(node->count)` in a tree); so do we, in its order.
F32 = np.float32


def _grow_path(data: np.ndarray, ends: np.ndarray, limit: int, min_prob: float) -> SuffixDraft:
    draft, prob = SuffixDraft(), F32(1.0)
    while len(draft.tokens) < limit:
        if ends.size == 1:  # a single occurrence: its continuation follows with probability unchanged
            p = int(ends[0]) + 1
            rest = data[p:p + limit - len(draft.tokens)]
            stop = np.flatnonzero(rest == SEPARATOR)
            rest = rest[: stop[0]] if stop.size else rest
            for t in rest.tolist():
                _push(draft, t, len(draft.tokens) - 1, prob)
            break
        kids = _children(data, ends)
        if not kids:
            break
        token, child = kids[0]  # the first in sibling order: the most frequent (`_speculate_path`)
        prob = F32(prob * (F32(child.size) / F32(ends.size)))
        if prob < F32(min_prob):
            break
        _push(draft, token, len(draft.tokens) - 1, prob)
        ends = child
    return draft


def _grow_tree(data: np.ndarray, ends: np.ndarray, limit: int, min_prob: float) -> SuffixDraft:
    """Best-first expansion by probability (the reference's `_speculate_tree`)."""
    draft, heap, counter = SuffixDraft(), [], 0

    def expand(node_ends: np.ndarray, prob: float, parent: int) -> None:
        nonlocal counter
        for token, child in _children(data, node_ends):
            # along a path without branches (the reference's compressed edge) the probability carries over
            p = prob if child.size == node_ends.size else F32(F32(prob * F32(child.size)) / F32(node_ends.size))
            if p >= F32(min_prob):
                heapq.heappush(heap, (-p, counter, token, child, parent))
                counter += 1

    expand(ends, F32(1.0), -1)
    while heap and len(draft.tokens) < limit:
        neg_p, _, token, child, parent = heapq.heappop(heap)
        _push(draft, token, parent, -neg_p)
        expand(child, -neg_p, len(draft.tokens) - 1)
    return draft


def _push(draft: SuffixDraft, token: int, parent: int, prob: float) -> None:
    draft.tokens.append(token)
    draft.parents.append(parent)
    draft.probs.append(float(prob))


class Suffix(Method):
    """Serving several sequences at once (`serve`), as in ArcticInference's cache, the global tree holds every
    finished request's output and every in-flight one's so far, each its own sequence; the local tree is the
    request's own. One sequence at a time, its output goes straight into the global store."""

    name = "suffix"

    @dataclass
    class Options(SpecParams):
        pass

    @dataclass
    class Lane:
        local_store: TokenStore = field(default_factory=TokenStore)  # this request's prompt + output
        last_draft: SuffixDraft = field(default_factory=SuffixDraft)
        response: TokenStore = field(default_factory=TokenStore)  # several in flight: this request's output so far

    def __init__(self, options: Options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        self.global_store = TokenStore()  # outputs of every request so far
        self.in_flight: list[TokenStore] | None = None  # several sequences at once: the outputs being decoded

    def serve(self, lanes: int) -> None:
        self.in_flight = [] if lanes > 1 else None

    def start(self, state: DecodeState) -> None:
        lane = self.lane(state)
        lane.local_store.extend(state.tokens)
        if self.in_flight is not None:
            self.in_flight.append(lane.response)
        outputs = self.outputs(state)
        outputs.new_sequence()
        outputs.extend(state.tokens[state.prompt_len:])

    def outputs(self, state: DecodeState) -> TokenStore:
        """Where this request's output goes as it is decoded: the global store one sequence at a time, its own
        with several in flight."""
        return self.global_store if self.in_flight is None else self.lane(state).response

    def finish(self, state: DecodeState) -> None:
        if self.in_flight is not None:  # the finished output joins the global store
            response = self.lane(state).response
            self.in_flight.remove(response)
            self.absorb(response.data.tolist())

    def lookup(self, state: DecodeState) -> SuffixDraft:
        """This round's draft: the better of the local and the global tree's (the global only if strictly)."""
        lane = self.lane(state)
        pattern = state.tokens[-self.options.max_depth:]
        draft = speculate(lane.local_store, pattern, self.options)
        every = self.global_store if self.in_flight is None else Joined([self.global_store, *self.in_flight])
        other = speculate(every, pattern, self.options)
        if other.score > draft.score:
            draft = other
        lane.last_draft = draft
        return draft

    def propose_one(self, state: DecodeState) -> DraftTree:
        return self.lookup(state).tree()

    def draft_info(self, state: DecodeState) -> dict:
        """What replay records of each lookup (HVD's payoff predictor trains on it)."""
        d = self.lane(state).last_draft
        return {"score": d.score, "match_len": d.match_len, "draft": list(d.tokens)}

    def observe(self, state: DecodeState, new_tokens: list[int]) -> None:
        self.lane(state).local_store.extend(new_tokens)
        self.outputs(state).extend(new_tokens)

    def absorb(self, output_ids: list[int]) -> None:
        self.global_store.new_sequence()
        self.global_store.extend(output_ids)
