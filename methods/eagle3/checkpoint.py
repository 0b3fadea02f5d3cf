"""EAGLE-3 checkpoints, flat or speculators layout, read into one `Eagle3Config` (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass

from specbench_methods.checkpoints import Checkpoint, CheckpointError
from specbench_methods.layers import rope_settings


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


def read_config(ckpt: Checkpoint, target_layers: int, what: str = "EAGLE-3") -> Eagle3Config:
    """The draft's shapes from config.json and the tensors themselves (tensors win where they disagree).
    `what` names the format in errors (a format built on this one reads its additions itself)."""
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
    theta, scaling = rope_settings(layer_cfg)
    return Eagle3Config(
        hidden=hidden, target_hidden=fc.shape[1] // 3, heads=heads, kv_heads=k.shape[0] // head_dim,
        head_dim=head_dim, intermediate=ckpt.take(prefix + "mlp.gate_proj.weight", (None, hidden)).shape[0],
        eps=float(layer_cfg.get("rms_norm_eps", 1e-6)), rope_theta=theta,
        rope_scaling=scaling, draft_vocab=head.shape[0],
        vocab=int(layer_cfg.get("vocab_size") or cfg.get("vocab_size") or head.shape[0]),
        capture=capture_layers(cfg, speculators, target_layers, ckpt),
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        qk_norm=ckpt.has(prefix + "self_attn.q_norm.weight"), layer_prefix=prefix,
        own_embedding=ckpt.has("embed_tokens.weight"))


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


def _checkpoint_name(name: str, layer_prefix: str) -> str:
    return layer_prefix + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name
