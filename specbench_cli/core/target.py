"""Target: the verifying model behind one KV cache.

prefill -> logits of the next token; verify(root, tree) -> logits of every tree node in one forward with a
tree attention mask and depth-based positions; commit(path) -> keep only the accepted path in the cache.
Drafters that read target features ask for layers with `capture`; forward hooks keep those layers'
outputs of the last forward (no `output_hidden_states` on every call).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specbench_cli.core.errors import UsageError
from specbench_cli.core.tree import DraftTree, SideTokens


class Target:
    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.cache: DynamicCache | None = None
        self.length = 0  # tokens whose KV is in the cache
        self.forwards = 0  # forward passes so far (rounds record how many they used)
        self.captured: dict[int, torch.Tensor] = {}  # layer index -> [T, H] output of the last forward
        self._hooks: list = []
        self._hooked: set[int] = set()
        self.reserved: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.side_hidden: torch.Tensor | None = None  # final hidden states of the last verify's side tokens
        self.last_path: list[int] = []  # the accepted path of the last commit (node indices, root first)
        self.root_logits: torch.Tensor | None = None  # set by extend(): the root is cached, these are its logits
        self.root_cached = False  # the verify being committed had its root in the cache already

    # ------------------------------------------------------------------------------------ features
    def capture(self, layers: list[int]) -> None:
        """Keep the outputs of these decoder layers (0-based) after every forward (idempotent)."""
        blocks = self.model.model.layers
        for i in layers:
            if i in self._hooked:
                continue
            if not 0 <= i < len(blocks):
                raise UsageError(f"a drafter reads target layer {i}, but the target has {len(blocks)} layers (0-{len(blocks) - 1})")
            self._hooked.add(i)
            def hook(_module, _args, output, i=i):
                self.captured[i] = (output[0] if isinstance(output, tuple) else output)[0]
            self._hooks.append(blocks[i].register_forward_hook(hook))

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    # ------------------------------------------------------------------------------------ ConFu hooks
    def reserve(self, kv: list[tuple[torch.Tensor, torch.Tensor]] | None) -> None:
        """Key/value entries ([kv heads, S, d] per layer) kept at the front of the cache from the next prefill
        on and visible only to side tokens (ConFu's soft prompt); the target's own tokens never see them."""
        self.reserved = kv

    @property
    def offset(self) -> int:
        return self.reserved[0][0].shape[1] if self.reserved else 0

    # ------------------------------------------------------------------------------------ forwards
    @torch.inference_mode()
    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Run the prompt through a fresh cache; returns the logits [V] of the next token."""
        self.cache = DynamicCache(config=self.model.config)
        self.root_logits, self.root_cached = None, False
        dtype = self.model.dtype
        for i, (k, v) in enumerate(self.reserved or []):
            self.cache.update(k[None].to(self.device, dtype), v[None].to(self.device, dtype), i)
        self.length = 0
        n = len(ids)
        mask = self._mask(torch.ones(n, n, dtype=torch.bool).tril()) if self.offset else None
        out = self.model(input_ids=torch.tensor([ids], device=self.device), attention_mask=mask,
                         position_ids=torch.arange(n, device=self.device)[None], past_key_values=self.cache,
                         use_cache=True, logits_to_keep=1)
        self.length = n
        self.forwards += 1
        return out.logits[0, -1]

    @torch.inference_mode()
    def verify(self, root: int, tree: DraftTree) -> torch.Tensor:
        """Logits [N+1, V] for the root (last committed token, not yet cached) and every draft node.

        A chain needs no mask (plain causal attention does it); a tree gets a 4D additive mask in which
        each node sees the cached prefix, itself and its ancestors, at position prefix + depth. Side tokens
        (`tree.side`) ride along in the same forward; their final hidden states land in `side_hidden`."""
        if self.root_logits is not None:
            return self._verify_after_extend(tree)
        ids = torch.tensor([[root, *tree.tokens]], device=self.device)
        n, side = ids.shape[1], tree.side
        self.forwards += 1
        if tree.is_chain and side is None and not self.offset:
            positions = torch.arange(self.length, self.length + n, device=self.device)[None]
            return self.model(input_ids=ids, position_ids=positions, past_key_values=self.cache,
                              use_cache=True).logits[0]
        positions = self.length + torch.tensor(tree.depths(), device=self.device)
        mask = self._mask(tree.ancestor_mask(), side)
        if side is None:
            return self.model(input_ids=ids, position_ids=positions[None], attention_mask=mask,
                              past_key_values=self.cache, use_cache=True).logits[0]
        embeds = torch.cat((self.model.get_input_embeddings()(ids[0]), side.embeds.to(self.model.dtype)))
        positions = torch.cat((positions, self.length + side.positions.to(self.device)))
        hidden = self.model.base_model(inputs_embeds=embeds[None], position_ids=positions[None], attention_mask=mask,
                                       past_key_values=self.cache, use_cache=True).last_hidden_state[0]
        self.side_hidden = hidden[n:]
        return self.model.get_output_embeddings()(hidden[:n])

    @torch.inference_mode()
    def extend(self, token: int) -> None:
        """A separate one-token forward that puts the round's last token into the cache now (the naive
        alternative to carrying it as the root of the next verify; FlashHead thesis §3.6.2's ablation)."""
        positions = torch.tensor([[self.length]], device=self.device)
        out = self.model(input_ids=torch.tensor([[token]], device=self.device), position_ids=positions,
                         past_key_values=self.cache, use_cache=True)
        self.forwards += 1
        self.length += 1
        self.root_logits = out.logits[0, -1]

    def _verify_after_extend(self, tree: DraftTree) -> torch.Tensor:
        """Verify a chain whose root is already cached: only the drafts go through the model."""
        if not tree.is_chain or tree.side is not None:
            raise ValueError("a root cached by extend() can only be followed by a chain")
        root_logits, self.root_logits = self.root_logits, None
        self.root_cached = True
        if not len(tree):
            return root_logits[None]
        positions = torch.arange(self.length, self.length + len(tree), device=self.device)[None]
        out = self.model(input_ids=torch.tensor([tree.tokens], device=self.device), position_ids=positions,
                         past_key_values=self.cache, use_cache=True)
        self.forwards += 1
        return torch.cat((root_logits[None], out.logits[0]))

    def _mask(self, new: torch.Tensor, side: SideTokens | None = None) -> torch.Tensor:
        """Additive 4D mask over [reserved | cached prefix | new tokens | side tokens].

        New tokens see the prefix and `new` [n, n] among themselves; side tokens see the reserved entries,
        the prefix, the new tokens their `attend` rows allow, and themselves."""
        n, m, r, length = new.shape[0], 0 if side is None else len(side), self.offset, self.length
        allowed = torch.zeros(n + m, r + length + n + m, dtype=torch.bool)
        allowed[:n, r:r + length] = True
        allowed[:n, r + length:r + length + n] = new
        if side is not None:
            allowed[n:, :r + length] = True
            allowed[n:, r + length:r + length + n] = side.attend
            allowed[n:, r + length + n:] = torch.eye(m, dtype=torch.bool)
        dtype = self.model.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[None, None].to(self.device)

    @torch.inference_mode()
    def commit(self, path: list[int]) -> None:
        """Keep the KV of the accepted path (node indices, root first) and drop the rest of the last verify.

        For a prefix of a chain this is a crop; otherwise the accepted entries are moved down in place."""
        assert self.cache is not None
        start = self.offset + self.length - (1 if self.root_cached else 0)  # cache index of the root
        self.root_cached = False
        if path != list(range(len(path))):
            src = torch.tensor(path, device=self.device) + start
            dst = torch.arange(start, start + len(path), device=self.device)
            for layer in self.cache.layers:
                layer.keys[:, :, dst] = layer.keys[:, :, src]
                layer.values[:, :, dst] = layer.values[:, :, src]
        keep = start + len(path)
        for layer in self.cache.layers:
            layer.keys = layer.keys[:, :, :keep]
            layer.values = layer.values[:, :, :keep]
        self.captured = {i: h[path] for i, h in self.captured.items()}
        self.last_path = path
        self.length = keep - self.offset
