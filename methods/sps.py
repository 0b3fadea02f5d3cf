"""Standard speculative sampling (SpS; Leviathan et al. 2023, Chen et al. 2023) with a small draft model.

The draft is any Hugging Face causal LM that shares the target's tokenizer (for Qwen3 targets the FlashHead
thesis pairs Qwen/Qwen3-0.6B). Each round it drafts a chain of K tokens with its own KV cache, one forward
per token; tokens it has not seen yet (last round's accepted drafts and bonus) are fed first in one pass.
At temperature 0 drafts are the argmax; above it they are sampled and verified with their probabilities.
The draft's body and its output head run separately so the head's share of draft time is recorded
(`draft_head`), the quantity FlashHead attacks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from specbench_cli.core.method import DecodeState, Method
from methods.checkpoints import CheckpointError, locate
from specbench_cli.core.target import VerifyExtras
from specbench_cli.core.tree import DraftTree


EMBEDDING_FROM_TARGET = "specbench_embedding_from_target"  # config key of the project's own draft models


def load_draft_model(ref: str, target: torch.nn.Module, what: str) -> torch.nn.Module:
    """A causal LM from a folder or hub id, checked to speak the target's vocabulary.

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
            with torch.no_grad():
                mine.weight.copy_(theirs.weight)
    rows = model.get_output_embeddings().weight.shape[0]
    if rows < target.config.vocab_size:
        raise CheckpointError(f"{folder}: the draft head has {rows} tokens, the target's vocabulary "
                              f"{target.config.vocab_size}; drafter and target must share a tokenizer")
    return model.to(target.device).eval()


class SpS(Method):
    name = "sps"
    drafter_names = ("sps",)
    inherent_syncs = "k + 1 per round: each draft token to host before the next draft step, and the accepted length"

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
        cache: DynamicCache | None = None  # the draft model's cache
        cached: list[int] = field(default_factory=list)  # tokens whose KV is in the draft cache
        root_logits: torch.Tensor | None = None  # deferred=false: the root's logits from its own forward

    def start(self, state: DecodeState) -> None:
        self.lane(state).cache = DynamicCache(config=self.draft.config)

    def feed(self, ids: list[int], state: DecodeState) -> torch.Tensor:
        """Run the draft body over `ids` after the cached tokens; return the last hidden state [H]."""
        lane, device = self.lane(state), state.target.device
        positions = torch.arange(len(lane.cached), len(lane.cached) + len(ids), device=device)[None]
        out = self.draft.base_model(input_ids=torch.tensor([ids], device=device), position_ids=positions,
                                    past_key_values=lane.cache, use_cache=True)
        lane.cached += ids
        return out.last_hidden_state[0, -1]

    def head(self, hidden: torch.Tensor, state: DecodeState) -> tuple[int, torch.Tensor | None]:
        """The next draft token and, when sampling, its distribution over the target vocabulary."""
        logits = self.draft.get_output_embeddings()(hidden).float()[: self.vocab]
        if state.temperature <= 0:
            return int(logits.argmax()), None
        probs = torch.softmax(logits / state.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=state.generator)), probs

    @torch.inference_mode()
    def propose_one(self, state: DecodeState) -> DraftTree:
        """k draft tokens one after another, each fed back to the draft model: per sequence on the host (a batch's
        sequences draft one after another)."""
        self._rewind(state)
        hidden = self.feed(state.tokens[len(self.lane(state).cached):], state)
        tokens, rows = [], []
        for i in range(self.options.k):
            with state.timed("draft_head"):
                token, probs = self.head(hidden, state)
            tokens.append(token)
            rows.append(probs)
            if i + 1 < self.options.k:
                hidden = self.feed([token], state)
        probs = None if rows[0] is None else torch.stack(rows)
        return DraftTree.chain(tokens, draft_probs=probs)

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
            lane.cache.crop(keep - len(lane.cached))  # transformers 5: a negative count removes that many
            lane.cached = lane.cached[:keep]
