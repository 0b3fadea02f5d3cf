"""Cross-engine fidelity: the same method, weights and prompt ids in our engine and in a production engine,
compared output by output and step by step.

Two runs pair up when they ran the same method with the same options and drafter weights on the same model,
dataset, dtype and temperature, one in our engine and one in another at one request in flight (at higher
concurrency an engine's numerics may depend on the batch). Per prompt turn the table says whether the output
ids are equal, how many verify steps each engine took, whether every step accepted the same number of tokens,
and the first step where they did not. Output ids can be equal while steps differ (a drafter computed
differently only changes what is accepted, never what is emitted), which is why only a step check sees an
engine drafting differently from the paper's method. Differences with a known cause in the engine are named
(`KNOWN_DIFFERENCES`), never hidden.
"""

from __future__ import annotations

import pandas as pd

from specbench_cli.analysis.metrics import first_pass
from specbench_cli.analysis.results import BEFORE, Results, RunGroup, drafter_identity
from specbench_cli.registry import engine_entry
from specbench_cli.analysis.tables import Table

# (engine, method, engine version prefix, device) -> the cause of a known step difference, with its source.
KNOWN_DIFFERENCES = {
    ("vllm", "dflash", "0.32", "cpu"): (
        "vLLM CPU rms_norm kernel normalises every drafter layer's context keys with layer 0's weight "
        "(stacked norm weight; fixed for Intel GPUs in vllm-xpu-kernels#573 / vllm#56431, not in the CPU kernel)"),
    **{("vllm", "suffix", "0.32", where): (
        "vLLM's suffix proposer caches every token a step verified, also those past max_tokens or a stop token that "
        "the output drops (vllm/v1/spec_decode/suffix_decoding.py, add_active_response of the runner's untrimmed "
        "sampled ids); our cache holds the outputs, so a later request's draft may differ") for where in ("cpu", "cuda")},
}


def _key(g: RunGroup) -> tuple:
    s = g.info["settings"]
    return (s["method"], repr(sorted(s.get("options", {}).items())), repr(sorted(drafter_identity(g.info).items())),
            s["model"], s["dataset"], s.get("dtype"), s["temperature"], s["max_new_tokens"])


def pairs(results: Results) -> list[tuple[RunGroup, RunGroup]]:
    """(ours, theirs) for every drafting method run in both engines under the same settings."""
    ours = {_key(g): g for g in results.groups if _ours(g)}
    found = []
    for g in results.groups:
        s = g.info["settings"]
        if not _ours(g) and s.get("concurrency", 1) == 1 and s["method"] != "baseline":
            if _key(g) in ours:
                found.append((ours[_key(g)], g))
    return found


def _ours(g: RunGroup) -> bool:
    """A run of our engine (a record from before engines names none)."""
    return engine_entry(g.info["settings"].get("engine", BEFORE["engine"])).our_target


def known_cause(theirs: RunGroup) -> str:
    """The engine defects this version is known for, and what the run itself recorded of the engine drafting
    otherwise (`vllm_methods`: e.g. a checkpoint vLLM reads with another attention mask)."""
    s, engine = theirs.info["settings"], theirs.info.get("engine", {})
    device = theirs.info.get("environment", {}).get("device", "cpu")
    version = str(engine.get("version", ""))
    causes = [cause for (name, method, prefix, where), cause in KNOWN_DIFFERENCES.items()
              if s.get("engine") == name and s["method"] == method and version.startswith(prefix) and where in device]
    return "; ".join([*causes, *engine.get("known_differences", [])])


def compare(ours: RunGroup, theirs: RunGroup) -> pd.DataFrame:
    """One row per prompt turn both runs finished (the first pass of each, `run --repeat`)."""
    rows = []
    mine = first_pass(ours.prompts).set_index(["prompt_id", "turn"])
    for t in first_pass(theirs.prompts).itertuples():
        if (t.prompt_id, t.turn) not in mine.index:
            continue
        o = mine.loc[(t.prompt_id, t.turn)]
        a = _accepted(ours.rounds, t.prompt_id, t.turn)
        b = _accepted(theirs.rounds, t.prompt_id, t.turn)
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        rows.append({"prompt_id": t.prompt_id, "turn": t.turn, "prompt ids equal": list(o.prompt_ids) == list(t.prompt_ids),
                     "output ids equal": list(o.output_ids) == list(t.output_ids), "steps ours": len(a),
                     "steps engine": len(b), "accepts equal": first is None,
                     "first difference": "—" if first is None else
                     f"step {first}: ours {_at(a, first)}, engine {_at(b, first)}"})
    return pd.DataFrame(rows)


def _accepted(rounds: pd.DataFrame, prompt_id: str, turn: int) -> list[int]:
    mine = first_pass(rounds[(rounds.prompt_id == prompt_id) & (rounds.turn == turn)]).sort_values("round")
    return mine.accepted.astype(int).tolist()


def _at(values: list[int], i: int) -> str:
    return str(values[i]) if i < len(values) else "ended"


def table(results: Results) -> Table:
    """Per method pair and prompt turn (see the module docstring)."""
    frames = []
    for ours, theirs in pairs(results):
        frame = compare(ours, theirs)
        s = theirs.info["settings"]
        cause = known_cause(theirs) if not frame["accepts equal"].all() else ""
        frames.append(frame.assign(method=ours.label, engine=s["engine"], **{"known engine cause": cause or "—"}))
    columns = ["method", "engine", "prompt_id", "turn", "prompt ids equal", "output ids equal", "steps ours",
               "steps engine", "accepts equal", "first difference", "known engine cause"]
    frame = pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)
    return Table("cross_engine", "Cross-engine fidelity: the same method, weights and prompt ids in our engine and "
                 "another (one request in flight), output by output and step by step", frame,
                 "accepts equal: every verify step accepted the same number of draft tokens; equal outputs with "
                 "unequal steps mean the engine drafts differently")
