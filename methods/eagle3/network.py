"""The EAGLE-3 draft network: one decoder layer over fused target features, with the draft vocabulary's head."""

from __future__ import annotations

import torch
from torch import nn

from specbench_cli.core.kernels import Linear
from specbench_methods.checkpoints import Checkpoint, CheckpointError
from specbench_methods.eagle3.checkpoint import Eagle3Config, _checkpoint_name, read_config
from specbench_methods.layers import MLP, Attention, RMSNorm, Rotary


class Eagle3Layer(nn.Module):
    """The draft decoder layer: attention reads [input_layernorm(embedding), hidden_norm(h)] (embedding first)."""

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.hidden_norm = RMSNorm(c.hidden, c.eps)
        self.input_layernorm = RMSNorm(c.hidden, c.eps)
        self.self_attn = Attention(2 * c.hidden, c.hidden, c.heads, c.kv_heads, c.head_dim, c.qk_norm, c.eps)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.eps)
        self.mlp = MLP(c.hidden, c.intermediate)
        self.norm_before_residual = c.norm_before_residual

    def token_kv(self, emb, h, cos, sin):
        """Keys/values of inputs the queries may see but that are not run through the layer (ConFu's [f])."""
        return self.self_attn.keys_values(self.inputs(emb, h)[0], cos, sin)

    def inputs(self, emb: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention input [embedding, h] (both normed) and the residual stream."""
        normed = self.hidden_norm(h)
        residual = normed if self.norm_before_residual else h
        return torch.cat((self.input_layernorm(emb), normed), dim=-1), residual

    def mlp_block(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward(self, emb, h, cos, sin, past=None, mask=None, extra=None):
        x, residual = self.inputs(emb, h)
        attn, kv = self.self_attn(x, cos, sin, past, mask, extra)
        return self.mlp_block(residual + attn), kv


class Eagle3Draft(nn.Module):
    """fc + one layer + norm + lm_head; the token embedding is the target's unless the checkpoint has one.

    A format built on EAGLE-3's (DART) subclasses this and overrides the hooks: `kind` (its name in errors),
    `layer_class`, `read_config` (what its config adds), `ignored_tensors` and `export`."""

    kind = "EAGLE-3"
    layer_class: type[Eagle3Layer] = Eagle3Layer

    def __init__(self, c: Eagle3Config, embedding: torch.Tensor) -> None:
        super().__init__()
        self.config = c
        self.fc = Linear(3 * c.target_hidden, c.hidden, bias=False)
        self.midlayer = self.layer_class(c)
        self.norm = RMSNorm(c.hidden, c.eps)
        self.lm_head = Linear(c.hidden, c.draft_vocab, bias=False)
        self.rotary = Rotary(c.head_dim, c.rope_theta, c.rope_scaling)
        self.embed_tokens = nn.Embedding(c.vocab, c.hidden) if c.own_embedding else None
        self.target_embedding = None if c.own_embedding else embedding
        self.register_buffer("d2t", torch.zeros(c.draft_vocab, dtype=torch.long) if c.draft_vocab != c.vocab else None)

    @classmethod
    def read_config(cls, ckpt: Checkpoint, target_layers: int) -> Eagle3Config:
        return read_config(ckpt, target_layers, cls.kind)

    @classmethod
    def ignored_tensors(cls, c: Eagle3Config) -> tuple[str, ...]:
        """Checkpoint tensors the draft does not load: t2d (d2t's inverse), and d2t itself when the vocabularies
        are equal (meaningless then; the reference deletes it)."""
        return ("t2d", *(("d2t",) if c.draft_vocab == c.vocab else ()))

    @classmethod
    def load(cls, ckpt: Checkpoint, target: nn.Module, extra_tensors: tuple[str, ...] = ()) -> Eagle3Draft:
        """`extra_tensors`: name prefixes of tensors the caller reads from the same checkpoint (ConFu's)."""
        c = cls.read_config(ckpt, target.config.num_hidden_layers)
        embedding = target.get_input_embeddings().weight.detach()
        if not c.own_embedding and embedding.shape[1] != c.hidden:
            raise CheckpointError(f"{ckpt.folder}: draft hidden size {c.hidden} differs from the target's "
                                  f"{embedding.shape[1]} and the checkpoint has no embed_tokens.weight")
        if c.target_hidden != target.config.hidden_size:
            raise CheckpointError(f"{ckpt.files.get('fc.weight')}: tensor 'fc.weight' expects target hidden size "
                                  f"{c.target_hidden}, the target has {target.config.hidden_size}")
        if c.vocab != embedding.shape[0]:
            raise CheckpointError(f"{ckpt.folder / 'config.json'}: vocab_size {c.vocab} differs from the target's "
                                  f"{embedding.shape[0]}")
        draft = cls(c, embedding)
        ckpt.load_into(draft, lambda name: _checkpoint_name(name, c.layer_prefix))
        ckpt.reject_unused(ignore=(*cls.ignored_tensors(c), *extra_tensors))
        return draft.to(embedding.device, embedding.dtype).eval()

    def export(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """config.json and tensors in the checkpoint's layout (what `load` reads back; used by the trainer)."""
        c = self.config
        tensors = {_checkpoint_name(k, c.layer_prefix): v for k, v in self.state_dict().items()}
        if self.d2t is not None:
            t2d = torch.zeros(c.vocab, dtype=torch.bool)
            t2d[self.to_target(torch.arange(c.draft_vocab, device=self.d2t.device)).cpu()] = True
            tensors["t2d"] = t2d
        layer = {"hidden_size": c.hidden, "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads,
                 "head_dim": c.head_dim, "intermediate_size": c.intermediate, "rms_norm_eps": c.eps,
                 "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling, "vocab_size": c.vocab,
                 "num_hidden_layers": 1, "model_type": "qwen3" if c.qk_norm else "llama"}
        # Both spellings of the feature layers: SpecForge's nested key names layer outputs (SGLang adds 1), vLLM
        # reads the top-level key as "input of layer j" and, without it, takes the nested one unchanged in that
        # meaning, one layer early (vllm/v1/worker/gpu_model_runner.py in 0.32; DFlash's ids it does shift by 1).
        ids = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": c.capture},
               "eagle_aux_hidden_state_layer_ids": [i + 1 for i in c.capture]}
        if c.layer_prefix == "layers.0.":  # speculators: nested layer config, vLLM's layer indexing
            config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                      "transformer_layer_config": layer, "draft_vocab_size": c.draft_vocab,
                      "target_hidden_size": c.target_hidden, "norm_before_residual": c.norm_before_residual,
                      "eagle_aux_hidden_state_layer_ids": [i + 1 for i in c.capture]}
        else:
            config = {"architectures": ["LlamaForCausalLMEagle3"], **layer, "draft_vocab_size": c.draft_vocab,
                      "target_hidden_size": c.target_hidden, **ids}
        return config, tensors

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight if self.embed_tokens is not None else self.target_embedding
        return nn.functional.embedding(ids, weight)

    def step(self, h: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, past=None, mask=None, extra=None,
             features: bool = True, **layer):
        """One draft forward over target features [T, 3Ht] (`features`) or the draft's own outputs [T, H];
        `layer`: what a subclass's layer takes besides (DART's `slots`)."""
        if features:
            h = self.fc(h)
        cos, sin = self.rotary(positions, h.dtype)
        return self.midlayer(self.embed(ids), h, cos, sin, past, mask, extra, **layer)

    def keys_values(self, h: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor):
        """The layer's keys/values for target features h [T, 3Ht] with tokens ids [T], and nothing else."""
        h = self.fc(h)
        cos, sin = self.rotary(positions, h.dtype)
        return self.midlayer.token_kv(self.embed(ids), h, cos, sin)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out)).float()

    def log_probs(self, out: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.logits(out), dim=-1)

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]

    def to_draft(self) -> torch.Tensor:
        """[V] draft id of each target token, -100 (cross-entropy's ignore index) outside the draft vocabulary."""
        index = torch.full((self.config.vocab,), -100)
        index[self.to_target(torch.arange(self.config.draft_vocab)).cpu()] = torch.arange(self.config.draft_vocab)
        return index

    def choose_vocab(self, sequences: list[list[int]]) -> None:
        """Draft vocabulary = the most frequent tokens of the training data, ascending (EAGLE-3's d2t)."""
        if self.d2t is None:
            return
        c = self.config
        counts = torch.bincount(torch.tensor([t for seq in sequences for t in seq], dtype=torch.long), minlength=c.vocab)
        keep = counts.argsort(descending=True, stable=True)[: c.draft_vocab].sort().values
        self.d2t.copy_(keep - torch.arange(c.draft_vocab))
