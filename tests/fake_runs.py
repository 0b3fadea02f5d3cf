"""Hand-made results directories with known answers, written through the real RunFolder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specbench_cli.records import RUN_TABLES, PromptRecord, RoundRecord, output_hash, run_parts
from specbench_cli.greedy_replay import NOT_REPLAYED, Replayed, replay_columns
from specbench_cli.run_folder import RunFolder, RunInfo, _marked

CPU = {"cpu": "Test CPU 9000", "device": "cpu", "torch_threads": 2, "git_commit": "abc"}


@dataclass
class Turn:
    prompt_id: str
    subtask: str
    accepted: list[int]  # per round: draft tokens accepted
    decode_ms: float
    depth: int = 4  # draft depth of every round (0 = no draft: a baseline round)
    ids: list[int] | None = None  # output ids (default: 0..n)
    category: str = ""
    turn: int = 0
    proposers: list[str] | None = None  # per round: who drafted (default: the method)
    prompt_ids: list[int] | None = None  # the turn's prompt ids (default: [1, 2, 3])
    replay: Replayed = NOT_REPLAYED  # the turn's greedy replay (greedy_replay.py)
    repeat: int = 0  # the pass (`run --repeat`) that decoded it

    @property
    def tokens(self) -> int:
        return sum(a + 1 for a in self.accepted)


def write_run(folder: Path, method: str, turns: list[Turn], env: dict | None = None, dataset: str = "spec-bench",
              options: dict | None = None, max_new_tokens: int = 128, phases: dict[str, float] | None = None,
              drafters: dict[str, str] | None = None, drafter_weights: dict[str, str] | None = None,
              settings: dict | None = None, more: dict | None = None) -> Path:
    """A complete run directory with one round row per accepted entry and one prompt row per turn (`drafters`:
    the `--drafter` overrides; `drafter_weights`: the fingerprints run.json records, left out when None;
    `settings`: run.json settings over the defaults; `more`: further run.json fields)."""
    writer = RunFolder(folder, RUN_TABLES)
    settings = {"method": method, "model": "tiny", "dataset": dataset, "temperature": 0.0, "max_new_tokens": max_new_tokens,
                "dtype": "float32", "target": "tiny-target", "options": options or {}, "shard": "0/1",
                "drafters": drafters or {}, **(settings or {})}
    weights = {} if drafter_weights is None else {"drafter_weights": drafter_weights}
    info = RunInfo(settings, "2026-01-01T00:00:00", env or CPU, more={"clock": "perf_counter_ns", **weights, **(more or {})})
    folder.mkdir(parents=True, exist_ok=True)
    writer.start(info, {"started": info.started, "environment": info.environment})
    info.status = "complete"
    writer.write_info(info)
    phases = phases or {"draft_ms": 1.0, "verify_ms": 8.0, "wall_ms": 10.0}
    by_prompt: dict[tuple[int, str], list[Turn]] = {}
    for t in turns:
        by_prompt.setdefault((t.repeat, t.prompt_id), []).append(t)
    per_pass = len({pid for _, pid in by_prompt})
    for (repeat, pid), mine in by_prompt.items():
        index = repeat * per_pass + list(dict.fromkeys(p for r, p in by_prompt if r == repeat)).index(pid)
        rounds, rows = [], []
        for t in mine:
            common = dict(run=folder.name, method=method, model="tiny", dataset=dataset, category=t.category or t.subtask,
                          subtask=t.subtask, prompt_id=pid, turn=t.turn)
            ids = t.ids if t.ids is not None else list(range(t.tokens + 1))
            rows.append(PromptRecord(**common, index=index, prompt_tokens=10, new_tokens=len(ids), decode_tokens=t.tokens,
                                     rounds=len(t.accepted), ttft_ms=5.0, decode_ms=t.decode_ms,
                                     tokens_per_s=t.tokens / t.decode_ms * 1e3, tau=t.tokens / len(t.accepted),
                                     stop_reason="max_new_tokens", clock="perf_counter_ns", output_hash=output_hash(ids),
                                     output_text="", output_ids=ids, prompt_ids=t.prompt_ids or [1, 2, 3],
                                     **replay_columns(t.replay)))
            for k, a in enumerate(t.accepted):
                ms = {f"{p}_ms": 0.0 for p in ("route", "catchup", "draft", "draft_head", "verify", "accept", "commit", "wall")}
                ms.update(phases)
                rounds.append(RoundRecord(**common, round=k, proposer=t.proposers[k] if t.proposers else method, tree_size=t.depth, draft_depth=t.depth,
                                          accepted=a, emitted=a + 1, kv_len=10 + k, target_forwards=1, **ms))
        writer.write_prompt(index, {name: _marked(table, repeat) for name, table in run_parts(rounds, rows).items()})
    return folder


def baseline_turns(turns: list[Turn], ms_per_token: float) -> list[Turn]:
    """The baseline of the same prompts: one token per round, same output ids."""
    return [Turn(t.prompt_id, t.subtask, [0] * t.tokens, t.tokens * ms_per_token, depth=0, ids=t.ids,
                 category=t.category, turn=t.turn, repeat=t.repeat) for t in turns]
