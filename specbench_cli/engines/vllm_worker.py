"""The vLLM side of `specbench run --engine vllm`: a small process that runs in the engine's own Python.

vLLM pins its own torch and transformers, so it usually lives in a virtual environment of its own
(`scripts/setup-vllm.sh` makes `.venv-vllm`). specbench starts this file with that environment's Python
(`engines/vllm.py`) and speaks JSON lines with it; the file imports only the standard library and vLLM, never
specbench. It drives vLLM's own engine loop (`vllm.LLMEngine`: `add_request`, `step`), so requests can be
added while others are in flight (the closed loop of a concurrency level), and every step's new tokens are
timed where they appear.

Protocol. stdin, first line: {"engine_args": {...}} (keyword arguments of `vllm.EngineArgs`, passed
unchanged). Then one line per command: {"op": "add", "id", "prompt_ids", "max_tokens", "temperature", "seed",
"stop_ids", "extra_args", "ignore_eos" (optional)}, {"op": "absorb", "output_ids"} (a finished output into the
drafter's suffix cache, as if a request had just produced it: a resumed run's finished prompts; answered
{"event": "absorbed", "cached": whether the drafter has such a cache}), {"op": "forget"} (the suffix and prefix
caches emptied, as a newly started engine's are: a new pass of `run --repeat`; answered {"event": "forgotten"})
or {"op": "close"} (the process ends at once, without tearing vLLM down object by object)
(`extra_args` go to SamplingParams unchanged: what a routed proposer reads per request, e.g. the category), or
{"op": "score", "id", "ids", "from", "top"}: the engine's log-probabilities over `ids` in one prefill (a
verify of the whole sequence: `prompt_logprobs`, its `top` tokens and the token itself at every position from
`from` on; answered {"event": "scored", "id", "logprobs": [[[token, logprob], ...], ...]}). stdout: {"event":
"ready", "version", "speculative_config"} once the engine is up, then {"event": "done", ...} per finished
request (`_done`), or {"event": "error", "message"} before exiting with status 1. Everything vLLM itself prints goes to stderr (the run folder's engine.log).
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
import traceback


def _protocol_stream():
    """A private copy of stdout for the protocol; fd 1 then points at stderr, so library prints (vLLM logs to
    stdout by default) cannot corrupt a message."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def _reader(commands: queue.Queue) -> None:
    for line in sys.stdin:
        if line.strip():
            commands.put(json.loads(line))
    commands.put({"op": "close"})  # the client went away


class Tracked:
    """One request's times: when it was added, and per engine step that gave it tokens, (time, new tokens)."""

    def __init__(self, arrival: float) -> None:
        self.arrival = arrival
        self.steps: list[tuple[float, int]] = []
        self.seen = 0


def _done(request_id: str, output, tracked: Tracked) -> dict:
    completion = output.outputs[0]
    metrics = getattr(completion, "spec_decode_metrics", None)
    return {"event": "done", "id": request_id, "output_ids": list(completion.token_ids),
            "finish_reason": completion.finish_reason, "arrival": tracked.arrival, "steps": tracked.steps,
            "spec": metrics.to_dict() if metrics is not None else None}


def _scored(request_id: str, output, start: int) -> dict:
    """A "score" request's prompt log-probabilities from position `start` on, as [token, logprob] pairs."""
    logprobs = output.prompt_logprobs  # a list, or vLLM's FlatLogprobs: indexed by position either way
    rows = [[[int(token), float(lp.logprob)] for token, lp in (logprobs[i] or {}).items()]
            for i in range(start, len(logprobs))]
    return {"event": "scored", "id": request_id, "logprobs": rows}


def _absorb(wrapper, output_ids: list[int], request: str) -> bool:
    """Run inside the engine's worker (`collective_rpc`): `output_ids` into the drafter's suffix cache (vLLM's
    SuffixDecodingProposer.suffix_cache, or specbench's HVD proposer's `cache`), the calls vLLM makes for a request
    (suffix_decoding.py: start_request, add_active_response, stop_request on finishing)."""
    import numpy as np

    runner = getattr(getattr(wrapper, "worker", wrapper), "model_runner", None)
    drafter = getattr(runner, "drafter", None)
    cache = getattr(drafter, "suffix_cache", None) or getattr(drafter, "cache", None)
    if cache is None or not hasattr(cache, "add_active_response"):
        return False
    cache.start_request(request, np.asarray([], dtype=np.int32))
    cache.add_active_response(request, list(output_ids))
    cache.stop_request(request)
    return True


def _forget(wrapper) -> bool:
    """Run inside the engine's worker (`collective_rpc`): the drafter's suffix cache (see `_absorb`) replaced by an
    empty one of the same depth and size, as the proposer built it at start-up."""
    runner = getattr(getattr(wrapper, "worker", wrapper), "model_runner", None)
    drafter = getattr(runner, "drafter", None)
    for name in ("suffix_cache", "cache"):
        cache = getattr(drafter, name, None)
        if cache is not None and hasattr(cache, "add_active_response"):
            setattr(drafter, name, type(cache)(max_tree_depth=cache.max_tree_depth,
                                               max_cached_requests=cache.max_cached_requests))
            return True
    return False


def serve(out) -> None:
    from vllm import EngineArgs, LLMEngine, SamplingParams, __version__

    config = json.loads(sys.stdin.readline())
    engine = LLMEngine.from_engine_args(EngineArgs(**config["engine_args"]))
    spec = engine.vllm_config.speculative_config
    # the K vLLM's scheduler takes at each batch size 1, 2, ... (its dense lookup of num_speculative_tokens_per_
    # batch_size, vllm/v1/core/sched/scheduler.py; None without the table or out of reach behind a process)
    scheduler = getattr(getattr(getattr(engine, "engine_core", None), "engine_core", None), "scheduler", None)
    lookup = getattr(scheduler, "dynamic_sd_lookup", None)
    out.write(json.dumps({"event": "ready", "version": __version__, "pid": os.getpid(),
                          "speculative_config": None if spec is None else str(spec),
                          "k_by_batch_size": lookup[1:] if lookup else None}) + "\n")
    commands: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(commands,), daemon=True).start()
    live: dict[str, Tracked] = {}
    scoring: dict[str, int] = {}  # a "score" request's id -> the first position it answers for
    absorbed = 0
    while True:
        busy = engine.has_unfinished_requests()
        try:
            command = commands.get(block=not busy)
        except queue.Empty:
            command = None
        if command is not None:
            if command["op"] == "close":
                return
            if command["op"] == "absorb":
                absorbed += 1
                cached = engine.collective_rpc(_absorb, args=(command["output_ids"], f"absorbed-{absorbed}"))
                out.write(json.dumps({"event": "absorbed", "cached": bool(cached and cached[0])}) + "\n")
                continue
            if command["op"] == "forget":
                engine.collective_rpc(_forget)
                engine.reset_prefix_cache()
                out.write(json.dumps({"event": "forgotten"}) + "\n")
                continue
            if command["op"] == "score":
                params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=command["top"], detokenize=False)
                engine.add_request(command["id"], {"prompt_token_ids": command["ids"]}, params)
                scoring[command["id"]] = command["from"]
                continue
            params = SamplingParams(max_tokens=command["max_tokens"], temperature=command["temperature"],
                                    seed=command.get("seed"), stop_token_ids=command["stop_ids"], detokenize=False,
                                    ignore_eos=command.get("ignore_eos", False),
                                    extra_args=command.get("extra_args"))
            engine.add_request(command["id"], {"prompt_token_ids": command["prompt_ids"]}, params)
            live[command["id"]] = Tracked(time.perf_counter())
            continue  # take every waiting command before the next step
        for output in engine.step():
            if output.request_id in scoring:
                if output.finished:
                    out.write(json.dumps(_scored(output.request_id, output, scoring.pop(output.request_id))) + "\n")
                continue
            now = time.perf_counter()
            tracked = live[output.request_id]
            count = len(output.outputs[0].token_ids)
            if count > tracked.seen:
                tracked.steps.append((now, count - tracked.seen))
                tracked.seen = count
            if output.finished:
                out.write(json.dumps(_done(output.request_id, output, live.pop(output.request_id))) + "\n")


def main() -> None:
    # Run as a file, Python puts this folder first on sys.path, where our own vllm.py would shadow the package.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    out = _protocol_stream()
    try:
        serve(out)
    except Exception as err:  # noqa: BLE001 - the client shows the cause in one line, the log has the rest
        traceback.print_exc()
        out.write(json.dumps({"event": "error", "message": f"{type(err).__name__}: {err}".splitlines()[0]}) + "\n")
        sys.exit(1)
    # Closed: nothing of the engine's is kept. The interpreter's own finalisation (vLLM's engine and modules torn
    # down object by object) takes seconds on a CPU, and the client waits for this process to end.
    out.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
