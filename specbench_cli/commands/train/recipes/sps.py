"""A small draft model for `sps` and `flashhead`: the target's first layers, fine-tuned to its outputs.

The draft keeps the target's first `draft_layers` decoder layers (2 by default) and its final norm, and
shares its token embedding and output head, which stay frozen and are not written to the checkpoint (the
config says so with `specbench_embedding_from_target`; `methods/sps.py` fills them from the target when it
loads the folder). The layers and the norm are trained to the target's next-token distribution on the
answers (top-k KL). FlashHead clusters for the (shared) head are built once and written to the same folder
in the released asset layout, so `flashhead` finds them beside its draft model.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from specbench_methods.checkpoints import save
from specbench_methods.flashhead import build_clustering, save_assets
from specbench_methods.sps import EMBEDDING_FROM_TARGET, load_draft_model
from specbench_cli.commands.train.distill import Corpus
from specbench_cli.commands.train.recipes import Recipe, Sample, half, kl_to_topk, top1


# target config keys that do not describe the draft: how the target was stored and where it came from
NOT_CARRIED = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version",
               "flash_head_cache_dir", "n_probes", "flash_head_special_token_ids")  # FlashHead's: save_assets writes them


def first_layers(target: torch.nn.Module, s) -> torch.nn.Module:
    """A new draft: the target's first `s.draft_layers` decoder layers (2 by default), norm, embedding and head."""
    config = target.config.__class__.from_dict(target.config.to_dict())
    config.num_hidden_layers = s.draft_layers or 2
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    model = type(target)(config)
    model.load_state_dict(target.state_dict(), strict=False)  # layers beyond the draft's are unused
    return model


class SpsRecipe(Recipe):
    needs_topk = True

    def __init__(self, target: torch.nn.Module, corpus: Corpus, s) -> None:
        """With `s.init` the draft starts from that checkpoint (its layers), trainable in float32."""
        self.model = load_draft_model(s.init, target, "sps").float().train() if s.init else first_layers(target, s)
        self.model.get_input_embeddings().requires_grad_(False)
        self.model.get_output_embeddings().requires_grad_(False)
        self.stop_ids = sorted({int(seq[-1]) for seq in corpus.sequences})
        self.layers = []
        self.positions = 1

    def loss(self, sample: Sample) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        T = sample.ids.shape[0]
        logits = self.model(sample.ids[None]).logits[0].float()
        rows = torch.arange(max(sample.prompt_len - 1, 0), T - 1, device=sample.ids.device)  # positions whose next token is an answer token
        log_q = torch.log_softmax(logits[rows], dim=-1)
        loss = kl_to_topk(log_q, sample.topk_ids[rows], sample.topk_probs[rows])
        return loss, [top1(log_q, sample.nxt[rows])]

    def export(self, out: Path) -> None:
        tensors = {k: v for k, v in self.model.state_dict().items()
                   if k not in ("model.embed_tokens.weight", "lm_head.weight")}
        config = {k: v for k, v in self.model.config.to_dict().items() if k not in NOT_CARRIED}
        config.update({EMBEDDING_FROM_TARGET: True, "dtype": "float16", "architectures": [type(self.model).__name__]})
        save(out, dict(sorted(config.items())), half(tensors))  # sorted: a config read back (--init) orders keys otherwise
        head = self.model.get_output_embeddings().weight.detach().float()
        c = build_clustering(head, special=self.stop_ids)
        save_assets(replace(c, centroids=c.centroids.half(), assignments=c.assignments.int()), out)  # half the bytes
