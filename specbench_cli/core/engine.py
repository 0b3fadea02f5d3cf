"""The one decode loop every method runs in.

    prefill -> first token
    while not done: route -> catch-up -> [extra target forward] -> draft -> verify -> accept
                    -> [batch-invariant greedy tree: verify and accept the path again as a chain] -> commit

Each round emits the accepted draft tokens plus one bonus token, cut at the first stop token and at the
max-new-tokens budget (never overshooting; tokens past a stop are neither emitted nor counted).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from specbench_cli.core.acceptance import Acceptance, accept
from specbench_cli.core.method import DecodeState, Method, Route
from specbench_cli.core.target import Target
from specbench_cli.core.tree import DraftTree
from specbench_cli.core.timing import PhaseClock, sync
from specbench_cli.core.turn import DecodeSettings, RoundInfo, TurnResult, cut, pick


def decode_turn(target: Target, method: Method, prompt_ids: list[int], settings: DecodeSettings,
                generator: torch.Generator | None = None, context: Mapping[str, str] | None = None) -> TurnResult:
    """Decode one turn. `context` (what the caller knows of the prompt) reaches the method as `state.context`."""
    if method.owns_loop:
        return method.generate(prompt_ids, settings, generator)  # type: ignore[attr-defined]
    device = target.device
    clock = PhaseClock(device)
    state, out, stopped, ttft_ms = open_turn(target, method, prompt_ids, settings, generator, context, clock)
    tokens = state.tokens
    infos: list[RoundInfo] = []
    t1 = time.perf_counter_ns()
    while not stopped and len(out) < settings.max_new_tokens:
        clock.start_round()
        kv_len, forwards = target.length, target.forwards
        route = Route(method)
        if method.routed:
            with clock.phase("route"):
                route = method.route(state)
            with clock.phase("catchup"):
                for p in (route.proposer, *route.also):
                    p.catch_up(state)
        proposer = route.proposer
        if proposer.extra_forwards:
            with clock.phase("extra_forward"):
                proposer.extra_forward(state)
        with clock.phase("draft"):
            tree = proposer.propose(state)
            extras = proposer.verify_extras(state, tree)
        with clock.phase("verify"):
            logits = target.verify(tokens[-1], tree, extras)
        with clock.phase("accept"):
            result = accept(tree, logits, settings.temperature, generator)
        size, depth = len(tree), max(tree.depths()) if len(tree) else 0
        if target.invariant and settings.temperature == 0 and not tree.is_chain:
            tree, logits, result = _exact_path(target, tokens[-1], tree, result.path, clock)
        new, stopped = cut(result.tokens, settings.stop_ids, settings.max_new_tokens - len(out))
        with clock.phase("commit"):
            commit(state, method, out, logits, result.path, new)
        clock.end_round()
        infos.append(RoundInfo(proposer=proposer.name, tree_size=size, draft_depth=depth, accepted=result.accepted,
                               emitted=len(new), kv_len=kv_len, target_forwards=target.forwards - forwards,
                               extras=route.extras))
    sync(device)
    decode_ms = (time.perf_counter_ns() - t1) / 1e6
    method.finish(state)
    for info, phases in zip(infos, clock.resolve()):
        info.phases = phases
    return TurnResult(out, "stop_token" if stopped else "max_new_tokens", ttft_ms, decode_ms, infos)


def open_turn(target: Target, method: Method, prompt_ids: list[int], settings: DecodeSettings,
              generator: torch.Generator | None, context: Mapping[str, str] | None,
              clock: PhaseClock) -> tuple[DecodeState, list[int], bool, float]:
    """Prefill a turn and start its proposer: (state, output so far, stopped, TTFT ms)."""
    method.attach(target)
    t0 = time.perf_counter_ns()
    prefill_logits = target.prefill(prompt_ids, room=settings.max_new_tokens)
    first = pick(prefill_logits, settings.temperature, generator)
    ttft_ms = (time.perf_counter_ns() - t0) / 1e6  # pick() read the token on the host: the device is done
    state = DecodeState([*prompt_ids, first], len(prompt_ids), target, settings.temperature, generator, clock,
                        dict(context or {}), prefill_logits)
    out, stopped = cut([first], settings.stop_ids, settings.max_new_tokens)
    method.start(state)
    return state, out, stopped, ttft_ms


def commit(state: DecodeState, method: Method, out: list[int], logits: torch.Tensor, path: list[int],
           new: list[int]) -> None:
    """Keep a round's accepted path (node indices, root first) and its emitted tokens `new`."""
    state.next_logits = logits[path[-1]]
    state.target.commit(path)
    state.tokens.extend(new)
    out.extend(new)
    method.observe(state, new)  # a routed method passes it to every proposer


def _exact_path(target: Target, root: int, tree: DraftTree, path: list[int],
                clock: PhaseClock) -> tuple[DraftTree, torch.Tensor, Acceptance]:
    """A batch-invariant target's greedy tree round: the accepted path verified again as a chain
    (`Target.verify_path`) and accepted on those logits, which a one-token decode would compute. Its time
    counts as verify and, on its own, as `reverify`."""
    with clock.phase("verify"), clock.phase("reverify"):
        chain, logits = target.verify_path(root, tree, path)
    with clock.phase("accept"):
        return chain, logits, accept(chain, logits, 0.0)
