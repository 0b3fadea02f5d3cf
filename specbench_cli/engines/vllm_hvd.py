"""Hybrid Verified Decoding inside vLLM: an EAGLE-3 proposer that first scores the suffix-cache draft.

HVD (Su et al. 2026, Appendix E) runs "in the vLLM speculative decoding path": per request and per step, the
payoff predictor scores the suffix-cache draft before verification; the step verifies that draft when the
predicted accepted length is at least τ, otherwise EAGLE-3's. Here a subclass of vLLM's `EagleProposer`
(installed by `vllm_routed.register`) owns an ArcticInference `SuffixDecodingCache` (the one vLLM's suffix
proposer uses, called as `vllm/v1/spec_decode/suffix_decoding.py` calls it) and our payoff predictor (the card
`specbench calibrate --method hvd` writes, loaded by `specbench_methods.predictors`; `hvd-freq` scores a draft by
SuffixDecoding's own frequency score instead).

Per step: every request's new tokens go into the suffix cache; the cache draft is looked up (a chain, as vLLM's
suffix proposer verifies it), its HVD features computed (`specbench_methods.hvd_features`, the same function our engine
and calibration use) and scored. EAGLE-3 then runs once for the batch: `num_speculative_tokens` = its chain
length when any request chose it, else 0 — vLLM's own "K = 0" path, which still runs the draft model's forward
over the step's verified tokens, so the drafter's KV cache stays in step with every token (the paper's catch-up,
paid each step rather than lazily). Requests that chose the cache get its draft instead of EAGLE-3's row.
"""

from __future__ import annotations

from pathlib import Path


def proposer_class(base: type) -> type:
    """`HvdProposer`, a subclass of vLLM's `base` (its EagleProposer), made in vLLM's process."""
    import numpy as np
    import torch
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    from specbench_methods.hvd_features import History, features
    from specbench_methods.predictors import PayoffPredictor
    from specbench_methods.router_policies import hvd_extras, verifies_cache
    from specbench_cli.engines.vllm_steps import NewTokens, StepLog, settings

    class Request:
        def __init__(self) -> None:
            self.history, self.decided, self.cache = History(), False, False

    class HvdProposer(base):
        specbench = True

        def __init__(self, vllm_config, device, runner=None) -> None:
            super().__init__(vllm_config, device, runner)
            self.batch_of = runner  # the model runner (which builds its drafter with itself as `runner`)
            s = settings()
            self.configured = self.num_speculative_tokens  # the engine's cap: max(chain, suffix max_spec_tokens)
            self.eagle_k, self.tau, self.suffix = int(s["eagle_k"]), float(s["threshold"]), s["suffix"]
            self.predictor = PayoffPredictor.load(Path(s["predictor"]))[0] if s["predictor"] else None
            self.classes = np.load(s["classes"])
            cached = vllm_config.speculative_config.suffix_decoding_max_cached_requests
            self.cache = SuffixDecodingCache(max_tree_depth=self.suffix["max_depth"], max_cached_requests=cached)
            self.max_model_len = vllm_config.model_config.max_model_len
            self.new_tokens, self.requests = NewTokens(), {}
            self.log = StepLog(s["log"])

        def propose(self, num_speculative_tokens: int, **inputs) -> list[list[int]]:
            batch = self.batch_of.input_batch
            cache_drafts = self._route(batch)
            use_eagle = any(d is None for d in cache_drafts.values())
            rows = super().propose(num_speculative_tokens=self.eagle_k if use_eagle else 0, **inputs).tolist()
            self.num_speculative_tokens = self.configured
            out = []
            for i, req_id in enumerate(batch.req_ids):
                draft = cache_drafts.get(req_id, [])
                out.append(rows[i] if draft is None else draft[:num_speculative_tokens])
            return out

        def _kept(self, req_id: str, new: list[int], generated: int) -> list[int]:
            """The new tokens the request's output keeps: a step may verify tokens past its max_tokens or its stop
            token, which the input batch holds and the output drops. vLLM's suffix proposer caches them too; the
            cache here holds the outputs, as our engine's does (and as the paper's cache of past responses)."""
            params = self.batch_of.requests[req_id].sampling_params
            new = new[:max(0, len(new) - max(0, generated - params.max_tokens))]
            stops = set(params.stop_token_ids or ())
            cut = next((j + 1 for j, t in enumerate(new) if t in stops), len(new))
            return new[:cut]

        @torch.inference_mode()
        def _route(self, batch) -> dict[str, list[int] | None]:
            """Per request with new tokens: the cache draft to verify, or None for EAGLE-3's."""
            chosen: dict[str, list[int] | None] = {}
            for i, req_id in enumerate(batch.req_ids):
                tokens = batch.token_ids_cpu[i]
                if req_id not in self.requests:
                    self.requests[req_id] = Request()
                    self.cache.start_request(req_id, tokens[:int(batch.num_prompt_tokens[i])])
                seen = self.new_tokens.step(batch, i)
                if seen is None or seen[1] >= self.max_model_len:
                    continue
                (before, n), request, prompt_len = seen, self.requests[req_id], int(batch.num_prompt_tokens[i])
                self.cache.add_active_response(req_id, self._kept(req_id, tokens[before:n].tolist(), n - prompt_len))
                if request.decided:
                    request.history.add(request.cache, n - before - 1)
                draft = self.cache.speculate(
                    req_id, tokens[max(0, n - self.suffix["max_depth"]):n],
                    max_spec_tokens=min(self.suffix["max_spec_tokens"], self.max_model_len - n - 1),
                    max_spec_factor=self.suffix["max_spec_factor"], min_token_prob=self.suffix["min_token_prob"])
                x = features(draft.score, draft.match_len, list(draft.token_ids), prompt_len, n - prompt_len,
                             request.history, self.classes)
                score = float(self.predictor(torch.from_numpy(x)[None])[0]) if self.predictor else float(draft.score)
                request.decided, request.cache = True, verifies_cache(len(draft.token_ids), score, self.tau)
                chosen[req_id] = list(draft.token_ids) if request.cache else None
                # backlog 0: EAGLE-3's first forward runs every step (K = 0 where the cache draft was chosen), so it
                # is never behind (docs/vllm-engine.md, section 4)
                self.log.decision(req_id, "suffix" if request.cache else "eagle3", **hvd_extras(0, score, x))
            # finished requests: their responses stay in the global tree
            for req_id in [r for r in self.requests if r not in batch.req_id_to_index]:
                self.cache.stop_request(req_id)
                del self.requests[req_id]
            self.new_tokens.forget(batch)
            return chosen

    return HvdProposer
