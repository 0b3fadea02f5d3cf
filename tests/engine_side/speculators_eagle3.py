"""Write an EAGLE-3 drafter with vLLM's `speculators` library (PyPI 0.9.0), as its authors' tools write one.

Run in the engine's Python (`.venv-vllm`, where `scripts/setup-vllm.sh` installs speculators beside vLLM):
    python speculators_eagle3.py FLAT_DRAFTER TARGET OUT
The drafter's weights are those of a flat (EAGLE/SpecForge layout) checkpoint, put into speculators'
`Eagle3DraftModel` with `load_state_dict` (strict: every parameter named) and saved by its `save_pretrained`,
so the folder holds exactly what speculators writes: its config (a nested `transformer_layer_config`, the
feature layers in vLLM's indexing) and its tensor names (`layers.0.*`, `embed_tokens`, `t2d`/`d2t`).
Imports only the standard library, torch, safetensors, transformers and speculators.
"""

from __future__ import annotations

import json
import sys

import torch
from safetensors.torch import load_file
from transformers import LlamaConfig


def main(flat: str, target: str, out: str) -> None:
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    drafter = json.load(open(f"{flat}/config.json"))
    verifier = json.load(open(f"{target}/config.json"))
    layer = LlamaConfig(vocab_size=drafter["vocab_size"], hidden_size=drafter["hidden_size"],
                        intermediate_size=drafter["intermediate_size"], num_hidden_layers=1,
                        num_attention_heads=drafter["num_attention_heads"],
                        num_key_value_heads=drafter["num_key_value_heads"], head_dim=drafter["head_dim"],
                        max_position_embeddings=verifier["max_position_embeddings"],
                        rms_norm_eps=drafter["rms_norm_eps"], rope_theta=drafter["rope_theta"])
    layer._attn_implementation = "eager"  # noqa: SLF001 - speculators' default (flex attention) is for training
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=drafter["draft_vocab_size"], norm_before_residual=False,
        eagle_aux_hidden_state_layer_ids=drafter["eagle_aux_hidden_state_layer_ids"],  # vLLM's indexing, as here
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_config(LlamaConfig(**{k: v for k, v in verifier.items() if k != "architectures"}),
                                                name_or_path=target)))
    model = Eagle3DraftModel(config)
    tensors = {k.replace("midlayer.", "layers.0."): v for k, v in load_file(f"{flat}/model.safetensors").items()}
    target_tensors = load_file(f"{target}/model.safetensors")
    tensors["embed_tokens.weight"] = target_tensors["model.embed_tokens.weight"]
    tensors["verifier_norm.weight"] = target_tensors["model.norm.weight"]  # training only (not saved)
    state = model.state_dict()
    tensors["verifier_lm_head.weight"] = state["verifier_lm_head.weight"].nan_to_num(0.0)  # training only (not saved)
    missing, unexpected = model.load_state_dict({k: v.to(state[k].dtype) for k, v in tensors.items()}, strict=True)
    assert not missing and not unexpected
    model.save_pretrained(out)
    print(json.dumps({"saved": out, "tensors": sorted(tensors)}))


if __name__ == "__main__":
    torch.manual_seed(0)
    main(*sys.argv[1:4])
