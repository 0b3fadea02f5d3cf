"""Target: the verifying model behind one KV cache.

prefill -> logits of the next token; verify(root, tree) -> logits of every tree node in one forward with a
tree attention mask and depth-based positions; commit(path) -> keep only the accepted path in the cache.
Drafters that read target features ask for layers with `capture`; forward hooks keep those layers'
outputs of the last forward (no `output_hidden_states` on every call).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specbench_cli.errors import UsageError
from specbench_cli.tree import DraftTree


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

    # ------------------------------------------------------------------------------------ forwards
    @torch.inference_mode()
    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Run the prompt through a fresh cache; returns the logits [V] of the next token."""
        self.cache = DynamicCache(config=self.model.config)
        input_ids = torch.tensor([ids], device=self.device)
        out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.length = len(ids)
        self.forwards += 1
        return out.logits[0, -1]

    @torch.inference_mode()
    def verify(self, root: int, tree: DraftTree) -> torch.Tensor:
        """Logits [N+1, V] for the root (last committed token, not yet cached) and every draft node.

        A chain needs no mask (plain causal attention does it); a tree gets a 4D additive mask in which
        each node sees the cached prefix, itself and its ancestors, at position prefix + depth."""
        input_ids = torch.tensor([[root, *tree.tokens]], device=self.device)
        n = input_ids.shape[1]
        if tree.is_chain:
            positions = torch.arange(self.length, self.length + n, device=self.device)[None]
            mask = None
        else:
            positions = (self.length + torch.tensor(tree.depths(), device=self.device))[None]
            mask = self._tree_mask(tree)
        out = self.model(input_ids=input_ids, position_ids=positions, attention_mask=mask,
                         past_key_values=self.cache, use_cache=True)
        self.forwards += 1
        return out.logits[0]

    def _tree_mask(self, tree: DraftTree) -> torch.Tensor:
        dtype = self.model.dtype
        allowed = torch.ones(len(tree) + 1, self.length + len(tree) + 1, dtype=torch.bool)
        allowed[:, self.length:] = tree.ancestor_mask()
        mask = torch.zeros(allowed.shape, dtype=dtype)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[None, None].to(self.device)

    @torch.inference_mode()
    def commit(self, path: list[int]) -> None:
        """Keep the KV of the accepted path (node indices, root first) and drop the rest of the last verify.

        For a prefix of a chain this is a crop; otherwise the accepted entries are moved down in place."""
        assert self.cache is not None
        start = self.length
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
        self.length = keep
