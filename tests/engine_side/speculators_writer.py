"""Write a drafter with vLLM's `speculators` library (PyPI 0.9.0), as its authors' tools write one.

Run in the engine's Python:  python speculators_writer.py {eagle3|dflash} FLAT_DRAFTER TARGET OUT
The weights of one of our committed drafters (EAGLE/SpecForge flat layout, z-lab DFlash layout) go into
speculators' own model class (`Eagle3DraftModel`, `DFlashDraftModel`) through a strict `load_state_dict`,
and out through its `save_pretrained`, so the folder holds exactly what speculators writes: its config (a
nested `transformer_layer_config`, feature layers in vLLM's indexing = our layer-output ids + 1) and its tensor
names; what it leaves out (the target's embedding and head, training-only verifier parts) stays out.
Imports only the standard library, torch, safetensors, transformers and speculators.
"""

from __future__ import annotations

import json
import sys

import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, Qwen3Config


def layer_config(kind, drafter: dict, verifier: dict):
    layer = kind(vocab_size=drafter["vocab_size"], hidden_size=drafter["hidden_size"],
                 intermediate_size=drafter["intermediate_size"], num_hidden_layers=drafter["num_hidden_layers"],
                 num_attention_heads=drafter["num_attention_heads"], num_key_value_heads=drafter["num_key_value_heads"],
                 head_dim=drafter["head_dim"], max_position_embeddings=verifier["max_position_embeddings"],
                 rms_norm_eps=drafter["rms_norm_eps"], rope_theta=drafter["rope_theta"])
    layer._attn_implementation = "eager"  # noqa: SLF001 - speculators' default (flex attention) is for training
    return layer


def speculators_config(algorithm: str, tokens: int, verifier: dict, target: str):
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    plain = LlamaConfig(**{k: v for k, v in verifier.items() if k != "architectures"})
    return SpeculatorsConfig(algorithm=algorithm, proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=tokens)],
                             default_proposal_method="greedy",
                             verifier=VerifierConfig.from_config(plain, name_or_path=target))


def eagle3(drafter: dict, verifier: dict, target: str):
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    return Eagle3DraftModel(Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config(LlamaConfig, drafter, verifier),
        draft_vocab_size=drafter["draft_vocab_size"], norm_before_residual=False,
        eagle_aux_hidden_state_layer_ids=drafter["eagle_aux_hidden_state_layer_ids"],  # vLLM's indexing already
        speculators_config=speculators_config("eagle3", 3, verifier, target)))


def dflash(drafter: dict, verifier: dict, target: str):
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

    ours = drafter["dflash_config"]
    return DFlashDraftModel(DFlashSpeculatorConfig(
        transformer_layer_config=layer_config(Qwen3Config, drafter, verifier),
        draft_vocab_size=drafter["vocab_size"], block_size=drafter["block_size"],
        aux_hidden_state_layer_ids=[i + 1 for i in ours["target_layer_ids"]], mask_token_id=ours["mask_token_id"],
        speculators_config=speculators_config("dflash", drafter["block_size"] - 1, verifier, target)))


def main(method: str, flat: str, target: str, out: str) -> None:
    drafter = json.load(open(f"{flat}/config.json"))
    verifier = json.load(open(f"{target}/config.json"))
    model = {"eagle3": eagle3, "dflash": dflash}[method](drafter, verifier, target)
    tensors = {k.replace("midlayer.", "layers.0."): v for k, v in load_file(f"{flat}/model.safetensors").items()}
    target_tensors = load_file(f"{target}/model.safetensors")
    state = model.state_dict()
    given = {"embed_tokens.weight": target_tensors["model.embed_tokens.weight"],  # the target's (not saved)
             "verifier_norm.weight": target_tensors["model.norm.weight"],  # training only (not saved)
             "verifier_lm_head.weight": state["verifier_lm_head.weight"].nan_to_num(0.0)}  # training only
    if "lm_head.weight" not in tensors:  # DFlash, full vocabulary: the target's tied head (not saved)
        given["lm_head.weight"] = target_tensors["model.embed_tokens.weight"]
    tensors |= {k: v for k, v in given.items() if k in state}
    missing, unexpected = model.load_state_dict({k: v.to(state[k].dtype) for k, v in tensors.items()}, strict=True)
    assert not missing and not unexpected
    model.save_pretrained(out)
    print(json.dumps({"saved": out, "tensors": sorted(tensors)}))


if __name__ == "__main__":
    torch.manual_seed(0)
    main(*sys.argv[1:5])
