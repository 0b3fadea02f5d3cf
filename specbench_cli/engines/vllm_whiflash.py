"""WhiFlash inside vLLM: an EAGLE-3 proposer that also owns vLLM's DFlash proposer and routes per request.

WhiFlash (Kwon et al. 2026) routes each round between an autoregressive drafter (EAGLE-3) and a block-diffusion
one (DFlash) by a policy read at the newest committed position: the entropy of the target's next-token
distribution (whiflash-entropy; EAGLE-3 above a per-category threshold) or an MLP on the target's last-layer
hidden state (whiflash-neural; EAGLE-3 when the predicted ΔAL exceeds its threshold). vLLM 0.32 has one drafter
per engine; this subclass of its `EagleProposer` (installed by `vllm_routed.register`) builds vLLM's own
`DFlashProposer` beside itself from a second speculative config and forwards every runner hook to both
(`load_model`, `initialize_attn_backend`, `validate_same_kv_cache_group`, `initialize_cudagraph_keys`,
`dummy_run`). What the runner needed besides (`patch_runner`): the target's auxiliary hidden states for both
drafters (and the router's layer) from one forward — `_get_eagle3_aux_layers_from_config` returns their union,
and each drafter gets its own columns — and the step's final hidden states, stashed for the entropy policy.
DFlash's layers are registered under the prefix `dflash` (both drafters number their layers after the
target's, and two `model.layers.30` would clash in the forward context).

Per step: each request with new tokens is routed; DFlash runs once for the batch (its block when any request
chose it, else `K = 0`: its context keys and values are still written, so it never falls behind), then EAGLE-3
the same way (after DFlash: EAGLE-3's first pass edits the attention metadata in place). A request gets the
rows of its drafter. Both catch up every step (the drafts are those of a lazy catch-up; only the cost differs).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from types import SimpleNamespace


def patch_runner(runner_cls: type) -> None:
    """Give a WhiFlash drafter the union of its drafters' auxiliary layers and the step's final hidden states."""
    if getattr(runner_cls, "specbench_whiflash", False):
        return
    aux_layers, propose = runner_cls._get_eagle3_aux_layers_from_config, runner_cls.propose_draft_token_ids

    def union_of_layers(self):
        drafter = getattr(self, "drafter", None)
        return drafter.aux_layers(aux_layers) if hasattr(drafter, "aux_layers") else aux_layers(self)

    def with_final_hidden(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states, *rest):
        if hasattr(self.drafter, "aux_layers"):
            self.drafter.final_hidden, self.drafter.token_indices = hidden_states, None
        return propose(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states, *rest)

    runner_cls._get_eagle3_aux_layers_from_config = union_of_layers
    runner_cls.propose_draft_token_ids = with_final_hidden
    runner_cls.specbench_whiflash = True


def proposer_class(base: type) -> type:
    """`WhiFlashProposer`, a subclass of vLLM's `base` (its EagleProposer), made in vLLM's process."""
    import torch
    from vllm.compilation.backends import set_model_tag
    from vllm.config import SpeculativeConfig
    from vllm.model_executor.model_loader import get_model
    from vllm.model_executor.model_loader.utils import get_draft_load_config
    from vllm.v1.spec_decode.dflash import DFlashProposer

    from specbench_methods.predictors import Router
    from specbench_methods.router_policies import category_threshold, eagle3_by_entropy, eagle3_by_score, whiflash_extras
    from specbench_cli.engines.vllm_steps import NewTokens, StepLog, settings

    class PrefixedDFlash(DFlashProposer):
        def _get_model(self):
            config = self._create_draft_vllm_config()
            with set_model_tag("dflash_head"):
                return get_model(vllm_config=config, model_config=self.speculative_config.draft_model_config,
                                 load_config=get_draft_load_config(config), prefix="dflash")

    class WhiFlashProposer(base):
        specbench = True

        def __init__(self, vllm_config, device, runner=None) -> None:
            super().__init__(vllm_config, device, runner)
            self.batch_of = runner
            s = settings()
            self.configured = self.num_speculative_tokens  # the engine's cap: max(chain, DFlash block)
            self.eagle_k, self.policy = int(s["eagle_k"]), s["policy"]
            dflash_config = copy.copy(vllm_config)  # shallow: the same compilation config and forward context
            dflash_config.speculative_config = SpeculativeConfig(
                method="dflash", model=s["dflash"], num_speculative_tokens=int(s["dflash_k"]),
                target_model_config=vllm_config.model_config, target_parallel_config=vllm_config.parallel_config)
            self.dflash = PrefixedDFlash(dflash_config, device, runner)
            self.dflash_k = self.dflash.num_speculative_tokens
            self.router = Router.load(Path(self.policy["router"]))[0] if self.policy["kind"] == "neural" else None
            layer = self.policy.get("layer")  # the router reads this decoder layer's output; the card's, else the last
            if layer is None:
                layer = vllm_config.model_config.hf_config.num_hidden_layers - 1
            self.router_aux = int(layer) + 1  # vLLM's number for the input of the next layer
            self.final_hidden, self.token_indices = None, None
            self.new_tokens, self.log = NewTokens(), StepLog(s["log"])

        # ------------------------------------------------------------------ the runner's hooks, for both drafters
        def aux_layers(self, read) -> tuple[int, ...]:
            """The target layers to keep (vLLM's numbering: the input of layer j), given the runner's reader of a
            speculative config's draft layers: EAGLE-3's, DFlash's and the neural router's, in order."""
            self.eagle_layers = tuple(read(SimpleNamespace(speculative_config=self.speculative_config)))
            self.dflash_layers = tuple(read(SimpleNamespace(speculative_config=self.dflash.speculative_config)))
            router = (self.router_aux,) if self.router is not None else ()
            self.layers = tuple(sorted({*self.eagle_layers, *self.dflash_layers, *router}))
            return self.layers

        def load_model(self, target_model) -> None:
            super().load_model(target_model)
            self.dflash.load_model(target_model)

        def initialize_attn_backend(self, *args, **kwargs) -> None:
            super().initialize_attn_backend(*args, **kwargs)
            self.dflash.initialize_attn_backend(*args, **kwargs)
            if self.dflash.kv_cache_gid != self.kv_cache_gid:  # the runner hands a step's metadata for EAGLE-3's only
                raise RuntimeError("WhiFlash in vLLM needs EAGLE-3's and DFlash's layers in one KV cache group")

        def validate_same_kv_cache_group(self, kv_cache_config) -> None:
            super().validate_same_kv_cache_group(kv_cache_config)
            self.dflash.validate_same_kv_cache_group(kv_cache_config)

        def initialize_cudagraph_keys(self, *args, **kwargs) -> None:
            super().initialize_cudagraph_keys(*args, **kwargs)
            self.dflash.initialize_cudagraph_keys(*args, **kwargs)

        def dummy_run(self, *args, **kwargs) -> None:
            super().dummy_run(*args, **kwargs)
            self.dflash.dummy_run(*args, **kwargs)

        def prepare_inputs(self, *args, **kwargs):
            metadata, token_indices = super().prepare_inputs(*args, **kwargs)
            self.token_indices = token_indices  # the accepted tokens' rows among the step's
            return metadata, token_indices

        # ------------------------------------------------------------------ a step
        def propose(self, num_speculative_tokens: int, target_hidden_states, **inputs) -> list[list[int]]:
            newest = inputs["common_attn_metadata"].query_start_loc_cpu[1:].long() - 1  # each request's last row
            chosen = self._route(newest, target_hidden_states)
            wants = set(chosen.values())
            dflash = self.dflash.propose(num_speculative_tokens=self.dflash_k if "dflash" in wants else 0,
                                         target_hidden_states=self._columns(target_hidden_states, self.dflash_layers),
                                         **inputs).tolist()
            eagle = super().propose(num_speculative_tokens=self.eagle_k if "eagle3" in wants else 0,
                                    target_hidden_states=self._columns(target_hidden_states, self.eagle_layers),
                                    **inputs).tolist()
            self.num_speculative_tokens, self.dflash.num_speculative_tokens = self.configured, self.dflash_k
            rows = {"eagle3": eagle, "dflash": dflash}
            return [rows[chosen[r]][i] if r in chosen else [] for i, r in enumerate(self.batch_of.input_batch.req_ids)]

        def _columns(self, hidden: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:
            width = hidden.shape[-1] // len(self.layers)
            return torch.cat([hidden[:, self.layers.index(j) * width:(self.layers.index(j) + 1) * width]
                              for j in layers], dim=-1)

        @torch.inference_mode()
        def _route(self, newest: torch.Tensor, hidden: torch.Tensor) -> dict[str, str]:
            """Per request with new tokens: "eagle3" or "dflash", by the policy at its newest committed position."""
            batch = self.batch_of.input_batch
            if self.router is not None:
                scores = self.router(self._columns(hidden, (self.router_aux,))[newest]).tolist()
                entropies = [math.nan] * len(scores)
            else:
                rows = newest if self.token_indices is None else self.token_indices[newest.to(self.token_indices.device)]
                logits = self.batch_of.model.compute_logits(self.final_hidden[rows]).float()
                logp = torch.log_softmax(logits, dim=-1)
                entropies, scores = (-(logp.exp() * logp).sum(-1)).tolist(), [math.nan] * len(newest)
            chosen = {}
            for i, req_id in enumerate(batch.req_ids):
                if self.new_tokens.step(batch, i) is None:
                    continue
                if self.router is not None:
                    eagle = eagle3_by_score(scores[i], self.policy["threshold"])
                else:
                    extra = self.batch_of.requests[req_id].sampling_params.extra_args or {}
                    eagle = eagle3_by_entropy(entropies[i], category_threshold(
                        self.policy["thresholds"], self.policy["threshold"], extra.get("category", "")))
                chosen[req_id] = "eagle3" if eagle else "dflash"
                # backlog 0: vLLM runs both drafters' first forward every step (the idle one with K = 0), so the
                # chosen one has nothing to catch up (docs/vllm-engine.md, section 4)
                self.log.decision(req_id, chosen[req_id], **whiflash_extras(0, entropies[i], scores[i]))
            self.new_tokens.forget(batch)
            return chosen

    return WhiFlashProposer
