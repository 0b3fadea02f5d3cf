"""ConFu ("Contemplate the Future", Qin et al., arXiv 2603.08899): EAGLE-3 plus a future token from the target.

No code or weights have been published, so this follows the paper's description; where it is silent the
choice is ours and says so.

Target side. Learnable soft-prompt key/value entries (16 by default, per layer) sit at the front of the
target's cache; only contemplate tokens see them. Each verify forward carries one contemplate token per
tree node (root included, so 2·(N+1) tokens in all): contemplate token i sees the soft prompt, the
prefix, node i and its ancestors, and itself; nothing sees the contemplate tokens, so the target's own
logits are exactly those of a plain verify (tested). The contemplate embedding comes from an MoE: a
linear router over the last accepted token's concatenated target features picks the top-K of n expert
embeddings and mixes them with softmax weights. The final hidden state of the contemplate token paired
with the last accepted node is the future vector f for the next round.
Draft side. A second MoE maps f to the draft's [f] embedding; its key/value (the draft layer's
projections of [input_layernorm(e_f), hidden_norm(e_f)]) is visible to every draft query of the round
and is not cached. The first round of a turn has no f yet.
Our choices (not in the text we had): contemplate token i sits at position(node i) + 1, the [f] entry at
the last committed position, n = 8 experts with top-2 routing.

Checkpoint format (ours): an EAGLE-3 flat checkpoint (config.json + model.safetensors) whose config has a
"confu" object {"soft_prompt_tokens", "experts", "top_experts"} and whose tensors add
  confu.soft_prompt.keys / .values   [target layers, target kv heads, S, target head dim] (rotated keys)
  confu.contemplate.router.weight    [n, 3·target hidden]   confu.contemplate.experts [n, target hidden]
  confu.future.router.weight         [n, target hidden]     confu.future.experts      [n, draft hidden]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specbench_cli.core.host_copy import to_device
from specbench_cli.core.method import DecodeState
from specbench_methods.checkpoints import Checkpoint, CheckpointError
from specbench_methods.eagle3 import Eagle3, Eagle3Draft
from specbench_cli.core.target import SideTokens, Target, VerifyExtras
from specbench_cli.core.tree import DraftTree


class MoE(nn.Module):
    """n expert embeddings mixed by a top-K softmax over a linear router's scores."""

    def __init__(self, in_dim: int, out_dim: int, experts: int, top: int) -> None:
        super().__init__()
        self.router = nn.Linear(in_dim, experts, bias=False)
        self.experts = nn.Parameter(torch.zeros(experts, out_dim))
        self.top = top

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        best = self.router(x).topk(self.top, dim=-1)
        return (torch.softmax(best.values, dim=-1)[..., None] * self.experts[best.indices]).sum(-2)  # any batch shape


@dataclass
class ConFuConfig:
    soft_prompt_tokens: int = 16  # the paper's default soft-prompt length
    experts: int = 8  # ours
    top_experts: int = 2  # ours


class ConFuParts(nn.Module):
    """The ConFu tensors next to the EAGLE-3 draft: soft prompt and the two MoEs."""

    def __init__(self, c: ConFuConfig, target: nn.Module, draft_hidden: int) -> None:
        super().__init__()
        t = target.config
        head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
        shape = (t.num_hidden_layers, t.num_key_value_heads, c.soft_prompt_tokens, head_dim)
        self.soft_keys = nn.Parameter(torch.zeros(shape))
        self.soft_values = nn.Parameter(torch.zeros(shape))
        self.contemplate = MoE(3 * t.hidden_size, t.hidden_size, c.experts, c.top_experts)
        self.future = MoE(t.hidden_size, draft_hidden, c.experts, c.top_experts)

    NAMES = {"soft_keys": "confu.soft_prompt.keys", "soft_values": "confu.soft_prompt.values"}

    @classmethod
    def load(cls, ckpt: Checkpoint, target: nn.Module, draft_hidden: int) -> ConFuParts:
        raw = ckpt.config.get("confu")
        if not isinstance(raw, dict):
            raise CheckpointError(f"{ckpt.folder / 'config.json'}: missing key 'confu' (not a ConFu checkpoint)")
        known = {k: int(raw[k]) for k in ("soft_prompt_tokens", "experts", "top_experts") if k in raw}
        parts = cls(ConFuConfig(**known), target, draft_hidden)
        ckpt.load_into(parts, lambda name: cls.NAMES.get(name, "confu." + name))
        weight = target.get_input_embeddings().weight
        return parts.to(weight.device, weight.dtype).eval()

    def export(self) -> dict[str, torch.Tensor]:
        return {self.NAMES.get(k, "confu." + k): v for k, v in self.state_dict().items()}

    def soft_prompt(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(k, v) for k, v in zip(self.soft_keys.detach(), self.soft_values.detach())]


class ConFu(Eagle3):
    name = "confu"
    drafter_names = ("confu",)
    extra_tensors = ("confu.",)

    @dataclass
    class Options(Eagle3.Options):
        pass

    @dataclass
    class Lane(Eagle3.Lane):
        future: torch.Tensor | None = None  # f from the last round's accepted contemplate token
        side: SideTokens | None = None  # this round's contemplate tokens

    def __init__(self, options: Options, model, drafters: dict[str, str] | None = None) -> None:
        super().__init__(options, model, drafters)
        self.parts = ConFuParts.load(self.checkpoint, model.model, self.draft.config.hidden)
        self.checkpoint.reject_unused(ignore=("t2d",))

    def attach(self, target: Target) -> None:
        super().attach(target)
        target.reserve(self.parts.soft_prompt())

    def observe(self, state: DecodeState, new_tokens: list[int]) -> None:
        super().observe(state, new_tokens)
        self.lane(state).future = state.target.side_hidden[state.target.last_path[-1]]

    def shared_kv(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The future token [f] (from the last round's accepted contemplate token), seen by every draft query."""
        return self._future_kv(state) if self.lane(state).future is not None else None

    @torch.inference_mode()
    def propose(self, states: list[DecodeState]) -> list[DraftTree]:
        trees = super().propose(states)
        for state, tree in zip(states, trees):
            self.lane(state).side = self._contemplate(state, tree)
        return trees

    def verify_extras(self, state: DecodeState, tree: DraftTree) -> VerifyExtras:
        """The contemplate tokens ride in the target's verify; their outputs give the next round's future token."""
        return VerifyExtras(side=self.lane(state).side)

    def _future_kv(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor]:
        e_f = self.parts.future(self.lane(state).future)[None]
        position = to_device([state.target.length - 1], e_f.device)
        cos, sin = self.draft.rotary(position, e_f.dtype)
        return self.draft.midlayer.token_kv(e_f, e_f, cos, sin)

    def _contemplate(self, state: DecodeState, tree: DraftTree) -> SideTokens:
        """One contemplate token per node (root first), all with the MoE embedding of the last accepted token."""
        n = len(tree) + 1
        embed = self.parts.contemplate(self.lane(state).last_features)
        mask = tree.mask()  # on the device when the tree is: nothing read
        return SideTokens(embed.expand(n, -1), tree.positions(mask) + 1, mask)


def new_parts(target: nn.Module, draft: Eagle3Draft, config: ConFuConfig = ConFuConfig(), scale: float = 0.02) -> ConFuParts:
    """Randomly initialised ConFu tensors (for the trainer and tests)."""
    parts = ConFuParts(config, target, draft.config.hidden)
    with torch.no_grad():
        for p in parts.parameters():
            p.normal_(0, scale)
    return parts
