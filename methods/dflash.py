"""DFlash (Chen et al. 2026): a block-diffusion drafter that fills a whole block of mask tokens in one forward.

Reference: z-lab/dflash `dflash/model.py` (`DFlashDraftModel`, `dflash_generate`). The released checkpoints
(z-lab/*-DFlash-*) declare remote code; we read their weights into our own module instead of running it.

  context: ctx = hidden_norm(fc(concat of the OUTPUTS of target layers `target_layer_ids`)), one row per
           verified position; it enters every draft layer only as extra keys/values (the layer's own k/v
           projections and k_norm, RoPE at the true positions) and is cached; the draft never computes
           hidden states for context positions.
  block:   [last verified token, mask × (block_size − 1)], embedded with the TARGET's embedding; attention
           is non-causal over context + block; logits come from the TARGET's lm_head. Position j of the block
           predicts its own token (no shift), so one forward drafts block_size − 1 tokens as a chain.
At temperature 0 the drafts are the argmax. Above it the default (`sampling=argmax`) is the reference's
scheme (z-lab/dflash main, `dflash_generate` at 44947fb: the block is the draft's argmax, and a draft token
is accepted while it equals the token the target samples there): the engine's rejection sampling with a
point-mass draft accepts token x with probability p(x) and otherwise draws from p without x, which is the
same distribution of accepted lengths and outputs. `sampling=sample` instead samples the block from the
draft's tempered distribution and verifies it with standard speculative sampling (Leviathan et al.).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import nn

from specbench_cli.core.acceptance import greedy_tokens
from specbench_cli.core.errors import UsageError
from specbench_cli.core.kernels import Linear, linear
from specbench_cli.core.host_copy import to_device
from specbench_cli.core.method import DecodeState
from specbench_methods.checkpoints import Checkpoint, CheckpointError
from specbench_methods.features import FeatureDrafter
from specbench_methods.layers import (MLP, Apart, Attention, DraftKV, RMSNorm, Rotary, Slots, causal_mask, rope_settings,
                                     round_slots)
from specbench_cli.core.tree import DraftTree


@dataclass
class DFlashConfig:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    eps: float
    rope_theta: float
    rope_scaling: dict | None
    capture: list[int]  # target decoder layers whose outputs form the context
    block_size: int
    mask_token_id: int
    embed_scale: float = 1.0  # dflash_config input_embedding_scale
    output_multiplier: float = 1.0
    softcap: float | None = None
    causal: bool = False


def _draft_value(cfg: dict, key: str, default=None):
    """The reference reads `dflash_config` first, then the top level."""
    return (cfg.get("dflash_config") or {}).get(key, cfg.get(key, default))


def default_capture(target_layers: int, count: int = 5) -> list[int]:
    """`count` layers evenly spaced from 1 to L-3, as SpecForge builds them when a config names none."""
    span = target_layers - 4
    return [round(1 + i * span / max(count - 1, 1)) for i in range(count)]


def speculators_config(ckpt: Checkpoint) -> dict:
    """A speculators DFlash config (vllm-project/speculators 0.9 `DFlashSpeculatorConfig`) in the z-lab schema:
    the layer's settings from `transformer_layer_config`, `aux_hidden_state_layer_ids` in vLLM's indexing
    (input of layer j, so the z-lab ids are one less: vllm/transformers_utils/configs/speculators/algos.py does
    the same), `mask_token_id` and `block_size` at the top. Its tensors already have the z-lab names; with the
    full vocabulary it saves no embedding and no head (the target's, as here)."""
    cfg = ckpt.config
    where = ckpt.folder / "config.json"
    layer = cfg.get("transformer_layer_config") or {}
    vocab, draft_vocab = layer.get("vocab_size"), cfg.get("draft_vocab_size")
    if draft_vocab is not None and vocab is not None and draft_vocab != vocab:
        raise CheckpointError(f"{where}: a reduced draft vocabulary ({draft_vocab} of {vocab}, with its own head and "
                              "d2t): specbench's DFlash drafts with the target's head, so only full-vocabulary "
                              "speculators DFlash checkpoints load")
    if cfg.get("sample_from_anchor"):
        raise CheckpointError(f"{where}: sample_from_anchor=true (the anchor drafts too); DFlash's anchor is the "
                              "last verified token, as in the paper and in vLLM")
    if "sliding_attention" in (layer.get("layer_types") or []):
        raise CheckpointError(f"{where}: sliding-window draft layers are not supported")
    for key in ("aux_hidden_state_layer_ids", "mask_token_id", "block_size"):
        if cfg.get(key) is None:
            raise CheckpointError(f"{where}: missing key '{key}' (speculators DFlash)")
    return {**layer, "block_size": cfg["block_size"],
            "dflash_config": {"mask_token_id": cfg["mask_token_id"],
                              "target_layer_ids": [int(i) - 1 for i in cfg["aux_hidden_state_layer_ids"]]}}


def read_config(ckpt: Checkpoint, target_layers: int) -> DFlashConfig:
    if ckpt.config.get("speculators_model_type") == "dflash":
        ckpt.config = speculators_config(ckpt)
    cfg = ckpt.config
    if _draft_value(cfg, "conv_kernel_size") is not None:
        raise CheckpointError(f"{ckpt.folder / 'config.json'}: a DFlash2 checkpoint (conv_kernel_size); only DFlash is supported")
    layer_ids = sorted({int(m.group(1)) for k in ckpt.tensors if (m := re.match(r"layers\.(\d+)\.", k))})
    if not layer_ids:
        raise CheckpointError(f"{ckpt.folder}: not a DFlash checkpoint (no 'layers.0.*' tensors)")
    hidden = ckpt.need("hidden_size")
    heads = ckpt.need("num_attention_heads")
    q = ckpt.take("layers.0.self_attn.q_proj.weight", (None, hidden))
    head_dim = q.shape[0] // heads
    fc = ckpt.take("fc.weight", (hidden, None))
    n_features = fc.shape[1] // hidden
    capture = _draft_value(cfg, "target_layer_ids")
    capture = [int(i) for i in capture] if capture is not None else default_capture(target_layers, n_features)
    if len(capture) * hidden != fc.shape[1]:
        raise CheckpointError(f"{ckpt.files.get('fc.weight')}: tensor 'fc.weight' reads {fc.shape[1]} features, "
                              f"but target_layer_ids has {len(capture)} layers of {hidden}")
    if any(not 0 <= i < target_layers for i in capture):
        raise CheckpointError(f"{ckpt.folder / 'config.json'}: target_layer_ids {capture} do not fit a target "
                              f"with {target_layers} layers")
    mask_token = _draft_value(cfg, "mask_token_id")
    if mask_token is None:
        raise CheckpointError(f"{ckpt.folder / 'config.json'}: missing key 'mask_token_id' (in dflash_config)")
    softcap = _draft_value(cfg, "final_logit_softcapping")
    theta, scaling = rope_settings(cfg)
    return DFlashConfig(
        hidden=hidden, heads=heads, kv_heads=ckpt.take("layers.0.self_attn.k_proj.weight").shape[0] // head_dim,
        head_dim=head_dim, intermediate=ckpt.take("layers.0.mlp.gate_proj.weight", (None, hidden)).shape[0],
        layers=len(layer_ids), eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta, rope_scaling=scaling,
        capture=capture, block_size=int(_draft_value(cfg, "block_size", 16)), mask_token_id=int(mask_token),
        embed_scale=float(_draft_value(cfg, "input_embedding_scale", 1.0)),
        output_multiplier=float(_draft_value(cfg, "output_multiplier", 1.0)),
        softcap=float(softcap) if softcap else None, causal=bool(cfg.get("is_causal", False)))


class DFlashLayer(nn.Module):
    """A Qwen3 decoder layer whose attention also sees the context keys/values."""

    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden, c.eps)
        self.self_attn = Attention(c.hidden, c.hidden, c.heads, c.kv_heads, c.head_dim, qk_norm=True, eps=c.eps)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.eps)
        self.mlp = MLP(c.hidden, c.intermediate)

    def forward(self, x, rope_x, past, mask, ctx_kv=None):
        """The block's new hidden states; it attends to past context, this call's context `ctx_kv`, itself."""
        attn, _ = self.self_attn(self.input_layernorm(x), *rope_x, past=past, mask=mask, extra=ctx_kv)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    def __init__(self, c: DFlashConfig, target: nn.Module) -> None:
        super().__init__()
        self.config = c
        self.layers = nn.ModuleList(DFlashLayer(c) for _ in range(c.layers))
        self.fc = Linear(len(c.capture) * c.hidden, c.hidden, bias=False)
        self.hidden_norm = RMSNorm(c.hidden, c.eps)
        self.norm = RMSNorm(c.hidden, c.eps)
        self.rotary = Rotary(c.head_dim, c.rope_theta, c.rope_scaling)
        # The target's embedding and head (not registered: they are not part of the checkpoint).
        self.target_parts = (target.get_input_embeddings(), target.get_output_embeddings())

    @classmethod
    def load(cls, ckpt: Checkpoint, target: nn.Module) -> DFlashDraft:
        c = read_config(ckpt, target.config.num_hidden_layers)
        if c.hidden != target.config.hidden_size:
            raise CheckpointError(f"{ckpt.folder / 'config.json'}: hidden_size {c.hidden} differs from the target's "
                                  f"{target.config.hidden_size} (DFlash shares the target's embedding and head)")
        if not 0 <= c.mask_token_id < target.config.vocab_size:
            raise CheckpointError(f"{ckpt.folder / 'config.json'}: mask_token_id {c.mask_token_id} is outside the "
                                  f"target vocabulary ({target.config.vocab_size})")
        draft = cls(c, target)
        ckpt.load_into(draft)
        ckpt.reject_unused()
        weight = target.get_input_embeddings().weight
        return draft.to(weight.device, weight.dtype).eval()

    def export(self, target_layers: int) -> tuple[dict, dict[str, torch.Tensor]]:
        """config.json (the z-lab/SpecForge schema) and tensors, for the trainer and tests."""
        c = self.config
        config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": c.hidden,
                  "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads, "head_dim": c.head_dim,
                  "intermediate_size": c.intermediate, "num_hidden_layers": c.layers, "rms_norm_eps": c.eps,
                  "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling, "block_size": c.block_size,
                  "num_target_layers": target_layers, "layer_types": ["full_attention"] * c.layers,
                  # the target's: vLLM sizes the draft's logits by it (without it, 151936, Qwen3's)
                  "vocab_size": self.target_parts[0].weight.shape[0],
                  "dflash_config": {"mask_token_id": c.mask_token_id, "target_layer_ids": c.capture}}
        return config, dict(self.state_dict())

    def context_kv(self, feats: torch.Tensor, ctx_start: int | torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the keys/values of context rows (target features of positions ctx_start.., or of the
        positions `ctx_start` lists): all the draft ever computes for context, which is why a DFlash catch-up is
        KV-only by construction."""
        ctx = self.hidden_norm(self.fc(feats))
        positions = ctx_start if isinstance(ctx_start, torch.Tensor) else \
            torch.arange(ctx_start, ctx_start + feats.shape[0], device=feats.device)
        rope_ctx = self.rotary(positions, ctx.dtype)
        return [layer.self_attn.keys_values(ctx, *rope_ctx) for layer in self.layers]

    def forward(self, feats: torch.Tensor, ctx_start: int, block_ids: torch.Tensor, block_start: int,
                past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                positions: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        """Hidden states [B, H] of the block, and each layer's new context (k, v).

        feats: target features of positions ctx_start.. (new context); past: cached context per layer.
        The trainer stacks many blocks in one call: it passes each row's `positions` and the `mask`
        [rows, context + rows] saying which context rows and which block rows each row sees."""
        new_kv = self.context_kv(feats, ctx_start)
        return self.block(block_ids, block_start, past, positions, mask, new_kv), new_kv

    def block(self, block_ids: torch.Tensor, block_start: int, past: list | None = None,
              positions: torch.Tensor | None = None, mask: torch.Tensor | None = None, new_kv: list | None = None):
        """The block's hidden states [B, H] over cached context `past` (+ this call's context `new_kv`)."""
        device, dtype = block_ids.device, self.fc.weight.dtype
        if positions is None:
            positions = torch.arange(block_start, block_start + block_ids.shape[0], device=device)
        rope_x = self.rotary(positions, dtype)
        x = nn.functional.embedding(block_ids, self.target_parts[0].weight) * self.config.embed_scale
        if mask is None and self.config.causal:
            mask = causal_mask(block_ids.shape[0], block_start, device)  # block_start context keys seen
        for i, layer in enumerate(self.layers):
            x = layer(x, rope_x, past[i] if past else None, mask, new_kv[i] if new_kv else None)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = linear(self.target_parts[1], hidden).float() * self.config.output_multiplier
        if self.config.softcap:
            logits = torch.tanh(logits / self.config.softcap) * self.config.softcap
        return logits


class DFlash(FeatureDrafter):
    name = "dflash"
    drafter_names = ("dflash",)
    inherent_syncs = "one per round: the accepted length, read with the block's draft tokens"

    @dataclass
    class Options:
        block_size: int = 0  # 0 = the checkpoint's block_size (16 for the z-lab Qwen3 drafters)
        sampling: str = "argmax"  # at T > 0: "argmax" drafts (the reference's scheme) or "sample" (SpS drafts)
        RANGES = {"block_size": (0, 256)}  # --opt ranges, checked before any model loads (1 drafts nothing)
        DEFAULT_TEXT = {"block_size": "from the checkpoint"}  # how run --list shows a default that is a stand-in

        def __post_init__(self) -> None:
            if self.block_size == 1:
                raise UsageError("dflash block_size=1 drafts nothing: use 0 (the checkpoint's) or >= 2")
            if self.sampling not in ("argmax", "sample"):
                raise UsageError(f"dflash sampling='{self.sampling}': choose argmax (the reference's) or sample")

    @dataclass
    class Lane(FeatureDrafter.Lane):
        ctx_kv: list[DraftKV] = field(default_factory=list)  # per layer: context K/V only

    def __init__(self, options: Options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        self.draft = DFlashDraft.load(Checkpoint.read(self.drafter_ref("dflash"), "dflash"), model.model)
        self.block_size = options.block_size or self.draft.config.block_size
        if self.block_size < 2:
            raise CheckpointError("dflash needs block_size >= 2")
        self.capture = self.draft.config.capture

    def absorbed(self, state: DecodeState) -> int:
        """Committed positions of the sequence whose context keys/values are cached."""
        ctx = self.lane(state).ctx_kv
        return ctx[0].length if ctx else 0

    @torch.inference_mode()
    def catch_up(self, states: list[DecodeState]) -> None:
        """Add the context keys/values of every committed position the draft has not seen, every sequence's new
        rows through one `context_kv` call."""
        todo = [(s, self.take_pending(s, self.absorbed(s))) for s in states if self.lane(s).pending]
        if not todo:
            return
        device = todo[0][1].device
        positions = torch.cat([torch.arange(self.absorbed(s), self.absorbed(s) + rows.shape[0], device=device)
                               for s, rows in todo])
        new_kv = self.draft.context_kv(torch.cat([rows for _, rows in todo]), positions)
        sizes = [rows.shape[0] for _, rows in todo]
        for j, (s, _) in enumerate(todo):
            lane = self.lane(s)
            lane.ctx_kv = lane.ctx_kv or [DraftKV().fixed(self.capacity) for _ in new_kv]
            for cache, (k, v) in zip(lane.ctx_kv, new_kv):
                cache.append(k.split(sizes, 1)[j], v.split(sizes, 1)[j])

    @torch.inference_mode()
    def propose(self, states: list[DecodeState]) -> list[DraftTree]:
        """Blocks for a batch of sequences in one forward: the new context rows of all of them (`catch_up`), then
        every sequence's block over its own context, the caches stacked and padded (`round_slots`: each layer
        writes the block's keys after the context and attends in place)."""
        draft, size, batch = self.draft, self.block_size, len(states)
        device = states[0].target.device
        self.catch_up(states)
        blocks = torch.full((batch, size), draft.config.mask_token_id, device=device)
        blocks[:, 0] = to_device([s.tokens[-1] for s in states], device)
        lengths = to_device([s.target.length for s in states], device)
        positions = lengths[:, None] + torch.arange(size, device=device)
        contexts = [self.lane(s).ctx_kv for s in states]
        like = torch.empty(draft.config.kv_heads, 0, draft.config.head_dim, device=device, dtype=draft.fc.weight.dtype)
        caches = [round_slots([ctx[i] for ctx in contexts], size, like) for i in range(len(draft.layers))]
        real = caches[0][1]  # which context entries are real (the same for every layer)
        own = torch.ones(size, size, dtype=torch.bool, device=device)
        if draft.config.causal:
            own = own.tril()
        mask = torch.cat((real[:, None].expand(-1, size, -1), own.expand(batch, -1, -1)), 2)
        hidden = self._block(blocks, positions, [kv for kv, _ in caches], mask)
        with states[0].timed("draft_head"):
            logits = self.run_step("head", draft.logits, hidden[:, 1:])
        if states[0].temperature <= 0 or self.options.sampling == "argmax":
            # a point mass each (see the module docstring), left on the device: the round's accept reads them
            return [DraftTree.chain(row) for row in greedy_tokens(logits)]
        probs = torch.softmax(logits / states[0].temperature, dim=-1)
        return [DraftTree.chain(torch.multinomial(p, 1, generator=s.generator)[:, 0], draft_probs=p)
                for p, s in zip(probs, states)]

    def _block(self, blocks: torch.Tensor, positions: torch.Tensor, past: list[Slots], mask: torch.Tensor):
        """The block's hidden states over each layer's round buffers: eager, every layer writes the block's keys
        into them and attends in place; compiled, one graph reads the whole buffers (`Apart`). The block's own
        keys are scratch either way (the context's come from `catch_up`)."""
        if self.graphs is None:
            return self.draft.block(blocks, 0, past, positions, mask)
        return self.graphs("block", self._apart_block, blocks, positions, [s.k for s in past], [s.v for s in past],
                           Apart.mask(mask, past[0]))

    def _apart_block(self, blocks, positions, ks, vs, mask):
        return self.draft.block(blocks, 0, [Apart(k, v) for k, v in zip(ks, vs)], positions, mask)

    # ------------------------------------------------------------------------------------ compiled
    def round_room(self) -> int:
        return self.block_size

    @torch.inference_mode()
    def warm_steps(self, batch: int) -> None:
        size = self.block_size
        ids = torch.zeros(batch, size, dtype=torch.long, device=self.device)
        slots = [self.blank_slots(batch) for _ in self.draft.layers]
        hidden = self._block(ids, ids, slots, self.own_keys_only(batch, size))
        self.run_step("head", self.draft.logits, hidden[:, 1:])
