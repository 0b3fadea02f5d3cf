"""hf-generate: transformers `generate()` on the same target, kept as an outside reference.

It runs its own loop, so it has no phases; a streamer timestamps each token, which gives TTFT and one
row per token with its host wall time (phase columns are left empty, not zero)."""

from __future__ import annotations

import time

import torch
from transformers.generation.streamers import BaseStreamer

from specbench_cli.core.method import OwnLoop
from specbench_cli.core.turn import DecodeSettings, RoundInfo, TurnResult, cut
from specbench_cli.core.timing import sync


class Stamps(BaseStreamer):
    """Host timestamps of every generated token (the prompt push is skipped)."""

    def __init__(self) -> None:
        self.times: list[int] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() first pushes the prompt
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter_ns())

    def end(self) -> None:
        pass


class HFGenerate(OwnLoop):
    name = "hf-generate"
    inherent_syncs = "transformers generate(): one per token (stopping criteria)"

    def generate(self, prompt_ids: list[int], settings: DecodeSettings, generator: torch.Generator | None) -> TurnResult:
        model, device = self.model.model, self.model.device
        sample = settings.temperature > 0
        if sample and generator is not None:
            torch.manual_seed(generator.initial_seed())  # generate() draws from the global RNG
        stamps = Stamps()
        stops = sorted(settings.stop_ids)
        t0 = time.perf_counter_ns()
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt_ids], device=device), max_new_tokens=settings.max_new_tokens,
                                 do_sample=sample, temperature=settings.temperature if sample else None,
                                 top_k=0 if sample else None, top_p=1.0 if sample else None,
                                 eos_token_id=stops or None, pad_token_id=stops[0] if stops else 0,
                                 streamer=stamps)
        sync(device)
        new, stopped = cut(out[0, len(prompt_ids):].tolist(), settings.stop_ids, settings.max_new_tokens)
        ttft_ms = (stamps.times[0] - t0) / 1e6
        decode_ms = (stamps.times[-1] - stamps.times[0]) / 1e6
        rounds = [RoundInfo(proposer=self.name, tree_size=0, draft_depth=0, accepted=0, emitted=1, kv_len=len(prompt_ids) + i,
                            target_forwards=1, phases={"wall": (b - a) / 1e6})
                  for i, (a, b) in enumerate(zip(stamps.times, stamps.times[1:]))]
        return TurnResult(new, "stop_token" if stopped else "max_new_tokens", ttft_ms, decode_ms, rounds)
