"""Hybrid Verified Decoding inside vLLM: an EAGLE-3 proposer that first scores the suffix-cache draft.

HVD (Su et al. 2026, Appendix E) runs "in the vLLM speculative decoding path": per request and per step, the
payoff predictor scores the suffix-cache draft before verification; the step verifies that draft when the
predicted accepted length is at least τ, otherwise EAGLE-3's. vLLM (0.32) builds one proposer per engine
(`vllm/v1/worker/gpu_model_runner.py`, `GPUModelRunner.__init__`, which the CPU runner inherits), and the
model-free `custom_class` proposer gets no target hidden states, which EAGLE-3 needs. So HVD is a subclass of
vLLM's own `EagleProposer` that owns an ArcticInference `SuffixDecodingCache` (the one vLLM's suffix proposer
uses, called as `vllm/v1/spec_decode/suffix_decoding.py` calls it) and our payoff predictor (the card `specbench
calibrate --method hvd` writes, loaded by `methods.predictors`), installed through vLLM's plugin mechanism:
the `vllm.general_plugins` entry point `register` (pyproject.toml), which vLLM calls in every process it starts
(engine core and workers), swaps the runner's `EagleProposer` for it when SPECBENCH_HVD names a settings file,
and does nothing otherwise. `scripts/setup-vllm.sh` installs specbench into vLLM's Python (no dependencies) for
the entry point; the proposer imports only vLLM, torch, numpy and `methods.{hvd_features,predictors}`.

Per step (the engine runs with `disable_padded_drafter_batch`, so the proposer is called after the step's
tokens are booked into the input batch): every request's new tokens go into the suffix cache; the cache draft
is looked up (a chain, as vLLM's suffix proposer verifies it), its HVD features computed (`methods.hvd_features`,
the same function our engine and calibration use) and scored. EAGLE-3 then runs once for the batch:
`num_speculative_tokens` = its chain length when any request chose it, else 0 — vLLM's own "K = 0" path, which
still runs the draft model's forward over the step's verified tokens, so the drafter's KV cache stays in step
with every token (the paper's catch-up, paid each step rather than lazily). Requests that chose the cache get its
draft instead of EAGLE-3's row. Each decision is one JSON line in the settings' log: request id (vLLM's, with
its random suffix), source, score, features; `engines/vllm.py` turns them into the rounds' proposer and extras.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV = "SPECBENCH_HVD"  # the settings file (JSON, `write_settings`); unset = the plugin does nothing
READY = "ready"  # the log's first line: the proposer was built inside vLLM


def register() -> None:
    """vLLM's `vllm.general_plugins` hook: with SPECBENCH_HVD set, EAGLE-3 runners build `HvdProposer`s."""
    path = os.environ.get(ENV)
    if not path:
        return
    import vllm
    from vllm.v1.worker import gpu_model_runner

    from specbench_cli.engines.vllm_methods import TESTED_VERSIONS

    minor = ".".join(vllm.__version__.split(".")[:2])
    if minor not in TESTED_VERSIONS:
        raise RuntimeError(f"specbench's HVD proposer supports vLLM {', '.join(TESTED_VERSIONS)}; this is "
                           f"{vllm.__version__} (its EagleProposer.propose may differ)")
    gpu_model_runner.EagleProposer = proposer_class(gpu_model_runner.EagleProposer)


def proposer_class(base: type) -> type:
    """`HvdProposer`, a subclass of vLLM's `base` (its EagleProposer), made in vLLM's process."""
    import numpy as np
    import torch
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    from methods.hvd_features import History, features
    from methods.predictors import PayoffPredictor

    class Request:
        def __init__(self, prompt_len: int) -> None:
            self.prompt_len, self.seen = prompt_len, prompt_len
            self.history, self.decided, self.cache = History(), False, False

    class HvdProposer(base):
        def __init__(self, vllm_config, device, runner=None) -> None:
            super().__init__(vllm_config, device, runner)
            self.batch_of = runner  # the model runner (which builds its drafter with itself as `runner`)
            settings = json.loads(Path(os.environ[ENV]).read_text())
            self.configured = self.num_speculative_tokens  # the engine's cap: max(chain, suffix max_spec_tokens)
            self.eagle_k, self.tau = int(settings["eagle_k"]), float(settings["threshold"])
            self.suffix = settings["suffix"]
            # hvd: the payoff predictor; hvd-freq: none, a draft scores SuffixDecoding's own frequency score
            self.predictor = PayoffPredictor.load(Path(settings["predictor"]))[0] if settings["predictor"] else None
            self.classes = np.load(settings["classes"])
            self.cache = SuffixDecodingCache(max_tree_depth=self.suffix["max_depth"],
                                             max_cached_requests=vllm_config.speculative_config.suffix_decoding_max_cached_requests)
            self.max_model_len = vllm_config.model_config.max_model_len
            self.requests: dict[str, Request] = {}
            self.log = open(settings["log"], "a", buffering=1)  # noqa: SIM115 - lives as long as the engine
            self.log.write(json.dumps({"event": READY, "pid": os.getpid()}) + "\n")

        def propose(self, num_speculative_tokens: int, **inputs) -> list[list[int]]:
            cache_drafts = self._route(self.batch_of.input_batch)
            use_eagle = any(d is None for d in cache_drafts.values())
            rows = super().propose(num_speculative_tokens=self.eagle_k if use_eagle else 0, **inputs).tolist()
            self.num_speculative_tokens = self.configured
            out = []
            for i, req_id in enumerate(self.batch_of.input_batch.req_ids):
                draft = cache_drafts.get(req_id, [])
                out.append(rows[i] if draft is None else draft[:num_speculative_tokens])
            return out

        @torch.inference_mode()
        def _route(self, batch) -> dict[str, list[int] | None]:
            """Per request with new tokens: the cache draft to verify, or None for EAGLE-3's."""
            chosen: dict[str, list[int] | None] = {}
            for i, req_id in enumerate(batch.req_ids):
                n = int(batch.num_tokens_no_spec[i])
                tokens = batch.token_ids_cpu[i]
                request = self.requests.get(req_id)
                if request is None:
                    request = self.requests[req_id] = Request(int(batch.num_prompt_tokens[i]))
                    self.cache.start_request(req_id, tokens[:request.prompt_len])
                new = tokens[request.seen:n].tolist()
                if not new or n >= self.max_model_len:  # a partial prefill, or no room left
                    continue
                request.seen = n
                self.cache.add_active_response(req_id, new)
                if request.decided:
                    request.history.add(request.cache, len(new) - 1)
                draft = self.cache.speculate(
                    req_id, tokens[max(0, n - self.suffix["max_depth"]):n],
                    max_spec_tokens=min(self.suffix["max_spec_tokens"], self.max_model_len - n - 1),
                    max_spec_factor=self.suffix["max_spec_factor"], min_token_prob=self.suffix["min_token_prob"])
                x = features(draft.score, draft.match_len, list(draft.token_ids), request.prompt_len,
                             n - request.prompt_len, request.history, self.classes)
                score = float(self.predictor(torch.from_numpy(x)[None])[0]) if self.predictor else float(draft.score)
                request.decided, request.cache = True, bool(draft.token_ids) and score >= self.tau
                chosen[req_id] = list(draft.token_ids) if request.cache else None
                self.log.write(json.dumps({"request": req_id, "source": "suffix" if request.cache else "eagle3",
                                           "score": score, "features": x.tolist(), "draft": list(draft.token_ids)}) + "\n")
            for req_id in set(self.requests) - set(batch.req_id_to_index):  # finished: into the global tree
                self.cache.stop_request(req_id)
                del self.requests[req_id]
            return chosen

    return HvdProposer


# ---------------------------------------------------------------------------------------------- specbench's side
class Decisions:
    """The proposer's log, read back as requests finish: per request (our id), its decisions in step order."""

    def __init__(self, log: Path) -> None:
        self.log, self.offset = log, 0
        self.pending: dict[str, list[dict]] = {}
        self.started = False

    @classmethod
    def prepare(cls, folder: Path, settings: dict, tokenizer, vocab: int) -> tuple[dict[str, str], Decisions]:
        """Write the proposer's settings, the vocabulary's class table and an empty log into the run folder; the
        environment that makes vLLM build the proposer, and the log's reader."""
        import numpy as np

        from methods.hvd_features import token_classes

        classes, log, path = folder / "hvd-classes.npy", folder / "hvd-steps.jsonl", folder / "hvd-proposer.json"
        np.save(classes, token_classes(tokenizer, vocab))
        log.write_text("")  # one engine start per session: request ids repeat across sessions
        path.write_text(json.dumps({**settings, "classes": str(classes), "log": str(log)}, indent=2))
        return {ENV: str(path)}, cls(log)

    def take(self, request_id: str) -> list[dict]:
        """`request_id`'s decisions (vLLM appends a random suffix to the id it was given: `-` and 8 characters)."""
        self.read()
        return self.pending.pop(request_id, [])

    def read(self) -> None:
        """Take in the lines written since the last read."""
        with self.log.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]  # a line being written is read next time
        self.offset += len(complete)
        for line in complete.decode().splitlines():
            entry = json.loads(line)
            if entry.get("event") == READY:
                self.started = True
            else:
                self.pending.setdefault(entry["request"].rsplit("-", 1)[0], []).append(entry)
