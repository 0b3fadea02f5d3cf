"""The one decode loop every method runs in.

    prefill -> first token
    while not done: route -> catch-up -> draft -> verify -> accept -> commit

Each round emits the accepted draft tokens plus one bonus token, cut at the first stop token and at the
max-new-tokens budget (never overshooting; tokens past a stop are neither emitted nor counted).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from methods.base import DecodeState, Method, Route
from specbench_cli.acceptance import accept
from specbench_cli.target import Target
from specbench_cli.timing import PhaseClock, sync


@dataclass
class RoundInfo:
    proposer: str
    tree_size: int
    draft_depth: int
    accepted: int  # draft tokens accepted (bonus excluded)
    emitted: int  # tokens this round added to the output (after any stop cut)
    kv_len: int  # target cache length before the round's verify
    target_forwards: int  # target forward passes in the round (1 unless a method needs extra ones)
    backlog: int = 0  # routed methods: positions the chosen proposer caught up on
    entropy: float = float("nan")  # routed methods: the policy's inputs and score
    router_score: float = float("nan")
    features: tuple[float, ...] = ()  # routed methods with a feature vector (HVD)
    phases: dict[str, float] = field(default_factory=dict)  # ms per phase and "wall"


@dataclass
class TurnResult:
    output_ids: list[int]
    stop_reason: str  # "stop_token" | "max_new_tokens"
    ttft_ms: float
    decode_ms: float
    rounds: list[RoundInfo]


@dataclass
class DecodeSettings:
    max_new_tokens: int
    temperature: float
    stop_ids: frozenset[int]


def pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Sample (or take the argmax of) one token from next-token logits [V]."""
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def cut(tokens: list[int], stop_ids: frozenset[int], budget: int) -> tuple[list[int], bool]:
    """Keep tokens up to and including the first stop token, and at most `budget`; say if a stop was hit."""
    for i, t in enumerate(tokens[:budget]):
        if t in stop_ids:
            return tokens[: i + 1], True
    return tokens[:budget], False


def decode_turn(target: Target, method: Method, prompt_ids: list[int], settings: DecodeSettings,
                generator: torch.Generator | None = None, category: str = "") -> TurnResult:
    if method.owns_loop:
        return method.generate(prompt_ids, settings, generator)  # type: ignore[attr-defined]
    device = target.device
    clock = PhaseClock(device)

    method.attach(target)
    t0 = time.perf_counter_ns()
    prefill_logits = target.prefill(prompt_ids)
    first = pick(prefill_logits, settings.temperature, generator)
    ttft_ms = (time.perf_counter_ns() - t0) / 1e6  # pick() read the token on the host: the device is done

    tokens = [*prompt_ids, first]
    state = DecodeState(tokens, len(prompt_ids), target, settings.temperature, generator, clock, category, prefill_logits)
    out, stopped = cut([first], settings.stop_ids, settings.max_new_tokens)
    method.start(state)
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
        with clock.phase("draft"):
            tree = proposer.propose(state)
        with clock.phase("verify"):
            logits = target.verify(tokens[-1], tree)
        with clock.phase("accept"):
            result = accept(tree, logits, settings.temperature, generator)
        new, stopped = cut(result.tokens, settings.stop_ids, settings.max_new_tokens - len(out))
        with clock.phase("commit"):
            state.next_logits = logits[result.path[-1]]
            target.commit(result.path)
            tokens.extend(new)
            out.extend(new)
            method.observe(state, new)  # a routed method passes it to every proposer
        clock.end_round()
        depth = max(tree.depths()) if len(tree) else 0
        infos.append(RoundInfo(proposer.name, len(tree), depth, result.accepted, len(new), kv_len,
                               target.forwards - forwards, route.backlog, route.entropy, route.score, route.features))
    sync(device)
    decode_ms = (time.perf_counter_ns() - t1) / 1e6
    method.finish(state)
    for info, phases in zip(infos, clock.resolve()):
        info.phases = phases
    return TurnResult(out, "stop_token" if stopped else "max_new_tokens", ttft_ms, decode_ms, infos)
