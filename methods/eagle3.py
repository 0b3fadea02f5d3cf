"""EAGLE-3 (Li et al. 2025): one draft decoder layer over three target feature layers, drafting a tree.

Reference: SafeAILab/EAGLE `eagle/model/cnets.py` (`Model.forward`, `topK_genrate`). Checkpoints in two
layouts load here:
  flat (yuhuili, AngelSlim, Tengyunw, SpecForge): `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`;
  speculators (vLLM, RedHatAI/*-speculator.eagle3): `layers.0.*` and a nested `transformer_layer_config`,
  optional q_norm/k_norm (Qwen3 layer) and `norm_before_residual`.
The head dimension is read from the q_proj shape (AngelSlim/Qwen3-4B_eagle3 has 32 heads × 128 with
H = 2560, which the SafeAILab code cannot load), and the draft's RoPE from the draft config (no
rope_theta -> 10000, as in the Llama-3.1 checkpoint).

Which target layers feed the draft, as 0-based indices of decoder layers whose OUTPUT is read:
  default: outputs of layers (1, L/2-1, L-4) = HF hidden_states indices (2, L/2, L-3);
  speculators `eagle_aux_hidden_state_layer_ids` use vLLM's indexing (id j = output of layer j-1);
  SpecForge `eagle_config.eagle_aux_hidden_state_layer_ids` name layer outputs directly (sglang adds 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specbench_cli.core.method import DecodeState
from methods.checkpoints import Checkpoint, CheckpointError
from methods.features import FeatureDrafter
from methods.layers import MLP, Attention, RMSNorm, Rotary, causal_mask
from specbench_cli.core.tree import DraftTree


# ---------------------------------------------------------------------------------------------- the model
@dataclass
class Eagle3Config:
    hidden: int
    target_hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    rope_theta: float
    rope_scaling: dict | None
    draft_vocab: int
    vocab: int
    capture: list[int]  # target decoder layers whose outputs are the features, low -> high
    norm_before_residual: bool
    qk_norm: bool
    layer_prefix: str  # "midlayer." (flat) or "layers.0." (speculators)
    own_embedding: bool
    mask_slots: int = 0  # DART's draft_length: mask positions appended after the context (0 for EAGLE-3)


def read_config(ckpt: Checkpoint, target_layers: int, dart: bool = False) -> Eagle3Config:
    """The draft's shapes from config.json and the tensors themselves (tensors win where they disagree).

    DART checkpoints are the flat EAGLE-3 layout plus `midlayer.mask_rep` [2H] and config `draft_length`;
    their embedding is always the target's (the reference overwrites any shipped copy)."""
    what = "DART" if dart else "EAGLE-3"
    cfg = ckpt.config
    speculators = "transformer_layer_config" in cfg
    layer_cfg = cfg["transformer_layer_config"] if speculators else cfg
    prefix = "layers.0." if speculators else "midlayer."
    if not ckpt.has(prefix + "self_attn.q_proj.weight"):
        raise CheckpointError(f"{ckpt.folder}: not an {what} checkpoint (no '{prefix}self_attn.q_proj.weight')")
    hidden = int(layer_cfg.get("hidden_size", 0)) or ckpt.take("norm.weight").shape[0]
    heads = int(layer_cfg.get("num_attention_heads", 0))
    if heads <= 0:
        raise CheckpointError(f"{ckpt.folder / 'config.json'}: missing key 'num_attention_heads'")
    q = ckpt.take(prefix + "self_attn.q_proj.weight", (None, 2 * hidden))
    k = ckpt.take(prefix + "self_attn.k_proj.weight", (None, 2 * hidden))
    head_dim = q.shape[0] // heads
    fc = ckpt.take("fc.weight", (hidden, None))
    if fc.shape[1] % 3:
        raise CheckpointError(f"{ckpt.files.get('fc.weight')}: tensor 'fc.weight' has {fc.shape[1]} inputs, not 3 × target hidden")
    head = ckpt.take("lm_head.weight", (None, hidden))
    scaling = layer_cfg.get("rope_scaling") or None
    return Eagle3Config(
        hidden=hidden, target_hidden=fc.shape[1] // 3, heads=heads, kv_heads=k.shape[0] // head_dim,
        head_dim=head_dim, intermediate=ckpt.take(prefix + "mlp.gate_proj.weight", (None, hidden)).shape[0],
        eps=float(layer_cfg.get("rms_norm_eps", 1e-6)), rope_theta=float(layer_cfg.get("rope_theta") or 10000.0),
        rope_scaling=scaling, draft_vocab=head.shape[0],
        vocab=int(layer_cfg.get("vocab_size") or cfg.get("vocab_size") or head.shape[0]),
        capture=capture_layers(cfg, speculators, target_layers, ckpt),
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        qk_norm=ckpt.has(prefix + "self_attn.q_norm.weight"), layer_prefix=prefix,
        own_embedding=ckpt.has("embed_tokens.weight") and not dart,
        mask_slots=ckpt.need("draft_length") if dart else 0)


def default_capture(target_layers: int) -> list[int]:
    """Outputs of layers (1, L/2-1, L-4) = HF hidden_states indices (2, L/2, L-3), EAGLE-3's choice."""
    return [1, target_layers // 2 - 1, target_layers - 4]


def capture_layers(cfg: dict, speculators: bool, target_layers: int, ckpt: Checkpoint) -> list[int]:
    """Target decoder layers (0-based) whose outputs the draft reads; see the module docstring."""
    vllm_ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    sglang_ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if vllm_ids:
        layers = [int(j) - 1 for j in vllm_ids]
    elif sglang_ids:
        layers = [int(j) for j in sglang_ids]
    else:
        layers = default_capture(target_layers)
    if any(not 0 <= i < target_layers for i in layers):
        raise CheckpointError(f"{ckpt.folder / 'config.json'}: feature layers {layers} (layer outputs) do not fit a "
                              f"target with {target_layers} layers")
    return layers


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
        self.slots = c.mask_slots
        if self.slots:
            self.mask_rep = nn.Parameter(torch.zeros(2 * c.hidden))

    def token_kv(self, emb, h, cos, sin):
        """Keys/values of inputs the queries may see but that are not run through the layer (ConFu's [f])."""
        return self.self_attn.keys_values(torch.cat((self.input_layernorm(emb), self.hidden_norm(h)), dim=-1), cos, sin)

    def forward(self, emb, h, cos, sin, past=None, mask=None, extra=None, slots: int | None = None):
        """`slots` mask rows are appended (default: the config's; the DART trainer stacks one block per
        anchor and then keeps every row); at inference only the last real position and the slots go on."""
        trim, slots = slots is None, self.slots if slots is None else slots
        normed = self.hidden_norm(h)
        residual = normed if self.norm_before_residual else h
        x = torch.cat((self.input_layernorm(emb), normed), dim=-1)
        if slots:  # DART: mask slots attend with input mask_rep and carry its first H entries as residual
            x = torch.cat((x, self.mask_rep.expand(slots, -1)))
            residual = torch.cat((residual, self.mask_rep[: h.shape[-1]].expand(slots, -1)))
        attn, kv = self.self_attn(x, cos, sin, past, mask, extra)
        h = residual + attn
        if trim and slots:
            h = h[-slots - 1:]
        return h + self.mlp(self.post_attention_layernorm(h)), kv


class Eagle3Draft(nn.Module):
    """fc + one layer + norm + lm_head; the token embedding is the target's unless the checkpoint has one."""

    def __init__(self, c: Eagle3Config, embedding: torch.Tensor) -> None:
        super().__init__()
        self.config = c
        self.fc = nn.Linear(3 * c.target_hidden, c.hidden, bias=False)
        self.midlayer = Eagle3Layer(c)
        self.norm = RMSNorm(c.hidden, c.eps)
        self.lm_head = nn.Linear(c.hidden, c.draft_vocab, bias=False)
        self.rotary = Rotary(c.head_dim, c.rope_theta, c.rope_scaling)
        self.embed_tokens = nn.Embedding(c.vocab, c.hidden) if c.own_embedding else None
        self.target_embedding = None if c.own_embedding else embedding
        self.register_buffer("d2t", torch.zeros(c.draft_vocab, dtype=torch.long) if c.draft_vocab != c.vocab else None)

    @classmethod
    def load(cls, ckpt: Checkpoint, target: nn.Module, dart: bool = False, extra_tensors: tuple[str, ...] = ()) -> Eagle3Draft:
        c = read_config(ckpt, target.config.num_hidden_layers, dart)
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
        # d2t is meaningless when the vocabularies are equal (the reference deletes it); DART ignores embeddings
        ignore = ("t2d", *extra_tensors, *(("d2t",) if c.draft_vocab == c.vocab else ()),
                  *(("embed_tokens.weight",) if dart else ()))
        ckpt.reject_unused(ignore=ignore)
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
        ids = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": c.capture}}
        if c.mask_slots:
            ids["draft_length"] = c.mask_slots
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
             features: bool = True, slots: int | None = None):
        """One draft forward over target features [T, 3Ht] (`features`) or the draft's own outputs [T, H]."""
        if features:
            h = self.fc(h)
        cos, sin = self.rotary(positions, h.dtype)
        return self.midlayer(self.embed(ids), h, cos, sin, past, mask, extra, slots)

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


def _checkpoint_name(name: str, layer_prefix: str) -> str:
    return layer_prefix + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name


# ---------------------------------------------------------------------------------------------- the tree
@dataclass
class Candidates:
    """Every node the beam search scored, in recording order: its cumulative log-prob, token, parent.

    `parent` is 0 for a child of the root, else 1 + the parent's recording index (EAGLE's convention)."""

    scores: torch.Tensor
    tokens: torch.Tensor
    parents: torch.Tensor


def grow(first: torch.Tensor, expand, top_k: int, depth: int) -> Candidates:
    """EAGLE's `topK_genrate` beam: level 1 is the top-k of `first` (log-probs [V]); then `depth` times the
    frontier (k nodes) is expanded by `expand(tokens, rows, level) -> log-probs [k, V]`, every child gets
    parent score + its log-prob, all k² are recorded, and the best k become the next frontier.

    `rows` says which earlier frontier node each new frontier node came from (the caller keeps per-node
    state such as the draft's hidden output); tokens are draft-vocabulary ids."""
    top = torch.topk(first, top_k)
    scores, tokens = top.values, top.indices
    record_s, record_t = [scores], [tokens]
    record_p = [torch.zeros(top_k, dtype=torch.long, device=first.device)]
    frontier = torch.arange(top_k, device=first.device)  # recording indices of the frontier nodes
    rows = torch.arange(top_k, device=first.device)
    offset = top_k
    for level in range(depth):
        logp = expand(tokens, rows, level)  # [k, V]
        top = torch.topk(logp, top_k, dim=-1)
        cumulative = (top.values + scores[:, None]).reshape(-1)
        record_s.append(cumulative)
        record_t.append(top.indices.reshape(-1))
        record_p.append((frontier + 1).repeat_interleave(top_k))
        best = torch.topk(cumulative, top_k).indices
        scores, tokens, rows = cumulative[best], top.indices.reshape(-1)[best], best // top_k
        frontier = offset + best
        offset += top_k * top_k
    return Candidates(torch.cat(record_s), torch.cat(record_t), torch.cat(record_p))


def keep_best(c: Candidates, total: int) -> tuple[list[int], list[int]]:
    """The global top `total` candidates by score, in recording order (parents before children).

    Returns (kept recording indices, tree parents with 0 = root). A child never outscores its parent and
    ties go to the earlier recording index, so every kept node's parent is kept too."""
    scores, recorded_parents = c.scores.tolist(), c.parents.tolist()  # the one read of the scores
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:total]
    kept = sorted(order)
    where = {idx: pos + 1 for pos, idx in enumerate(kept)}
    parents = [0 if recorded_parents[i] == 0 else where[recorded_parents[i] - 1] for i in kept]
    return kept, parents


# ---------------------------------------------------------------------------------------------- the method
def append_kv(kv, new):
    """Grow a (k, v) pair [heads, T, d] along T."""
    return new if kv is None else (torch.cat((kv[0], new[0]), 1), torch.cat((kv[1], new[1]), 1))


class Eagle3(FeatureDrafter):
    name = "eagle3"
    drafter_names = ("eagle3",)
    extra_tensors: tuple[str, ...] = ()  # checkpoint tensors a subclass reads itself (ConFu's "confu.*")
    inherent_syncs = "two per round: the candidate scores for tree selection, and the accepted length"

    @dataclass
    class Options:
        # WhiFlash seed Table 7 (EAGLE-3 settings): tree depth 8, top-k 10, 60 tree tokens. total_token
        # counts the root as in SafeAILab's `total_token` (59 drafted nodes). The HVD seed's setting is
        # total_token=32 depth=8 top_k=4 (the EAGLE Qwen3 evaluation script).
        depth: int = 8
        top_k: int = 10
        total_token: int = 60
        # --opt ranges, checked before any model loads: (low, high), None = unbounded.
        RANGES = {"depth": (0, 64), "top_k": (1, 256), "total_token": (2, 1024)}

    def __init__(self, options: Options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        self.checkpoint = Checkpoint.read(self.drafter_ref(self.name), self.name)
        self.draft = Eagle3Draft.load(self.checkpoint, model.model, extra_tensors=self.extra_tensors)
        self.capture = self.draft.config.capture
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = None  # draft KV of positions fed by target features
        # Keys/values every draft query of the round also sees (ConFu's future token); not cached.
        self.extra_kv: tuple[torch.Tensor, torch.Tensor] | None = None
        self.kv_only = True  # catch-up computes keys/values only (WhiFlash's ablation sets False)

    def _visible(self, mask: torch.Tensor, past: int, extra: list) -> tuple[torch.Tensor, tuple | None]:
        """Put `extra_kv` first among the extra keys (after `extra`, whose columns `mask` already has) and
        give it an all-visible column block right after the `past` cached columns."""
        parts = ([self.extra_kv] if self.extra_kv is not None else []) + extra
        if not parts:
            return mask, None
        kv = (torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1))
        if self.extra_kv is None:
            return mask, kv
        ones = torch.ones(mask.shape[0], self.extra_kv[0].shape[1], dtype=torch.bool, device=mask.device)
        return torch.cat((mask[:, :past], ones, mask[:, past:]), 1), kv

    def reset(self, state: DecodeState) -> None:
        self.kv = None

    @torch.inference_mode()
    def catch_up(self, state: DecodeState) -> None:
        """KV-only prefill (WhiFlash §3.3): the draft cache of every committed position but the newest gets
        only its keys/values (fc, norms, k/v projections), never attention, MLP or head, whose outputs
        nothing reads. A routed method calls this for the backlog after an idle stretch; `advance` calls it
        every round, so a plain EAGLE-3 run and a routed one build the same cache the same way."""
        start = self.absorbed
        feats = self.take_pending(state, start)
        n, device = feats.shape[0], feats.device
        if n > 1:
            ids = torch.tensor(state.tokens[start + 1: start + n], device=device)
            positions = torch.arange(start, start + n - 1, device=device)
            if self.kv_only:
                kv = self.draft.keys_values(feats[:-1], ids, positions)
            else:  # the ablation: run the whole layer over the backlog (outputs discarded)
                mask, extra = self._visible(causal_mask(n - 1, start, device), start, [])
                _, kv = self.draft.step(feats[:-1], ids, positions, self.kv, mask, extra)
            self.kv = append_kv(self.kv, kv)
        self.pending = [feats[-1:]]

    @property
    def absorbed(self) -> int:
        """Committed positions already in the draft cache."""
        return 0 if self.kv is None else self.kv[0].shape[1]

    @torch.inference_mode()
    def advance(self, state: DecodeState) -> torch.Tensor:
        """Bring the draft up to the committed length and return its output at the newest position (feature
        t with token t+1), from which the tree grows."""
        self.catch_up(state)
        start = self.absorbed
        feats = self.take_pending(state, start)
        device = feats.device
        ids = torch.tensor(state.tokens[start + 1: start + 2], device=device)
        self.last_features = feats[-1]
        mask, extra = self._visible(causal_mask(1, start, device), start, [])
        out, (k, v) = self.draft.step(feats, ids, torch.arange(start, start + 1, device=device), self.kv, mask, extra)
        self.kv = append_kv(self.kv, (k, v))
        return out[-1]

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> DraftTree:
        last = self.advance(state)
        o = self.options
        with state.timed("draft_head"):
            first = self.draft.log_probs(last)
        hidden = last.expand(o.top_k, -1)
        tree_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        eye = torch.eye(o.top_k, dtype=torch.bool, device=last.device)
        ancestry = eye
        length = state.target.length

        def expand(tokens, rows, level):
            nonlocal hidden, ancestry
            if level > 0:
                hidden = hidden[rows]
                ancestry = torch.cat((ancestry[rows], eye), dim=1)
            ids = self.draft.to_target(tokens)
            positions = torch.full((o.top_k,), length + level, device=last.device)
            stable = self.kv[0].shape[1]
            mask = torch.cat((torch.ones(o.top_k, stable, dtype=torch.bool, device=last.device), ancestry), dim=1)
            mask, extra = self._visible(mask, stable, tree_kv)
            out, kv = self.draft.step(hidden, ids, positions, self.kv, mask, extra, features=False)
            tree_kv.append(kv)
            hidden = out
            with state.timed("draft_head"):
                return self.draft.log_probs(out)

        cands = grow(first, expand, o.top_k, o.depth)
        kept, parents = keep_best(cands, o.total_token - 1)
        tokens = self.draft.to_target(cands.tokens[kept]).tolist()
        return DraftTree(tokens, parents)
