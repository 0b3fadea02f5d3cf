"""ConFu training (ConFu paper §3.3, scaled down): soft prompt, contemplate MoE, anchor tokens, and
future-prediction replication, on top of an EAGLE-3 draft trained with the training-time test.

Per sequence: the target's cache of the whole sequence is computed once without gradients (nothing in
the prefix sees the soft prompt or a contemplate token, so it does not depend on what is trained). At K
sampled anchors a, a contemplate token — the contemplate MoE of the anchor's features — sits at position
a+1 and attends to the soft prompt, the prefix up to a, and itself, exactly as in a verify forward; its
final hidden state is the future vector f_a, with gradients into the soft prompt and the MoE through the
frozen target. The future MoE turns f_a into the draft's [f] entry at position a; draft rows a..a+l−1 see
it at every TTT step (replication over l = 3 neighbouring positions: ours, the text we had gives no l).
The draft starts from an EAGLE-3 checkpoint when one is given (`init`), else from scratch; the loss is the
EAGLE-3 recipe's, with [f] visible.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import DynamicCache

from specbench_methods.checkpoints import save
from specbench_methods.confu import ConFuConfig, new_parts
from specbench_cli.commands.train.distill import Corpus
from specbench_cli.commands.train.recipes import Recipe, Sample, half, pick_anchors
from specbench_cli.commands.train.recipes.eagle3 import start_draft, ttt_loss

REPLICATE = 3  # draft positions that share one anchor's f


class ConFuRecipe(Recipe):
    def __init__(self, target: torch.nn.Module, corpus: Corpus, s, **shape) -> None:
        self.model = start_draft(target, corpus, s, **shape)
        self.parts = new_parts(target, self.model, ConFuConfig())
        self.model.confu = self.parts  # registered on the draft so the loop's optimiser and state see it
        self.target = target
        self.layers = self.model.config.capture
        self.positions = s.ttt
        self.anchors = s.anchors
        self.to_draft = self.model.to_draft()

    def futures(self, sample: Sample, anchors: torch.Tensor) -> torch.Tensor:
        """f [N, H]: final hidden states of contemplate tokens at anchors + 1 (see the module docstring)."""
        T, N, model, device = sample.ids.shape[0], anchors.shape[0], self.target, sample.ids.device
        with torch.no_grad():
            prefix = model(input_ids=sample.ids[None], use_cache=True).past_key_values
        cache = DynamicCache(config=model.config)
        for i, (k, v) in enumerate(zip(self.parts.soft_keys, self.parts.soft_values)):
            layer = prefix.layers[i]
            cache.update(torch.cat((k[None], layer.keys), 2), torch.cat((v[None], layer.values), 2), i)
        S = self.parts.soft_keys.shape[2]
        allowed = torch.cat((torch.ones(N, S, dtype=torch.bool, device=device),
                             torch.arange(T, device=device)[None] <= anchors[:, None],
                             torch.eye(N, dtype=torch.bool, device=device)), dim=1)
        mask = torch.zeros(allowed.shape, device=device).masked_fill_(~allowed, torch.finfo(torch.float32).min)
        embeds = self.parts.contemplate(sample.feats[anchors])
        out = model.base_model(inputs_embeds=embeds[None], position_ids=(anchors + 1)[None],
                               attention_mask=mask[None, None], past_key_values=cache, use_cache=True)
        return out.last_hidden_state[0]

    def loss(self, sample: Sample) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        T, device = sample.ids.shape[0], sample.ids.device
        anchors = pick_anchors(max(sample.prompt_len - 1, 0), T - 3, self.anchors, self.model.training, device)
        e_f = self.parts.future(self.futures(sample, anchors))
        cos, sin = self.model.rotary(anchors, e_f.dtype)
        f_kv = self.model.midlayer.token_kv(e_f, e_f, cos, sin)
        rows = torch.arange(T, device=device)[:, None]
        sees = (rows >= anchors[None]) & (rows < anchors[None] + REPLICATE)
        return ttt_loss(self.model, sample.feats, sample.ids, sample.nxt, self.positions, self.to_draft, (f_kv, sees))

    def export(self, out: Path) -> None:
        config, tensors = self.model.export()
        draft = {k: v for k, v in tensors.items() if not k.startswith("confu.")}  # the parts, as registered above
        c = self.parts
        config["confu"] = {"soft_prompt_tokens": c.soft_keys.shape[2], "experts": c.contemplate.experts.shape[0],
                           "top_experts": c.contemplate.top}
        save(out, config, half({**draft, **c.export()}))
