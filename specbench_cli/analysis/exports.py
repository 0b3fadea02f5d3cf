"""`report --export FORMAT DIR`: the runs' records in a layout another tool reads.

**spec-bench**: the answer files Spec-Bench's `evaluation/eval.py` writes (hemingkx/Spec-Bench), one jsonl per run
group (under a folder per dataset), which its `evaluation/speed.py` reads to print tokens/s, the speedup over a baseline file and the mean
accepted tokens. A line per prompt and pass: `question_id`, `category`, `answer_id`, `model_id`, `tstamp` and
one choice of `turns` (the answer texts), `decoding_steps`, `new_tokens`, `wall_time` and `accept_lengths`
(tokens each step added, accepted + 1, as its inference scripts append `input_ids.shape[1] - cur_length`).

What the numbers mean, so that speed.py's figures equal ours: speed.py rates a method's prompt as Σ new_tokens /
Σ wall_time over its turns, and we rate it as Σ decode tokens / Σ decode time (TTFT excluded, the first token
being the prefill's), so `new_tokens` holds the decode tokens and `wall_time` the decode seconds (Spec-Bench's own
scripts time the whole generate call). It rates the *baseline* by re-tokenizing the answer texts (tokens - 1 per
turn), which equals our decode tokens where the text round-trips to the same tokens and the tokenizer adds one
BOS; elsewhere (a tokenizer without BOS, an answer that is only the stop token) its baseline rate is off ours,
and so is every speedup it prints: the export says by how much (`speed_py_notes`).

**specdec-bench**: what NVIDIA's specdec_bench (NVIDIA/Model-Optimizer, examples/specdec_bench) writes for
acceptance and timing, a folder per run group: `acceptance_rate.json` (its `AcceptanceRate.out`: `Request_AL`
per request and turn, `Average_AL` = their mean, the `Acceptance_Length_Histogram` of tokens per step, and the
`Conditional_Acceptance_Rate` and `Joint_Acceptance_Rate` keyed by length as its `_process_lengths` makes them),
`timing.json` (its `Timing.out`: output TPS, and min/max/mean/std/quartiles of request time, TTFT, step time,
per-request generation tokens/s and output tokens) and `speculation_profile.json` (its schema 1.0: conditional
and marginal acceptance per draft position, the per-step mean AL and the per-request one, and the checks that
1 + Σ marginal equals the per-step mean and that the marginals do not increase). A step here is one of our
rounds (the prefill's first token is not one). The per-step mean is our τ (Σ tokens / Σ rounds, what every
other table uses); `Average_AL`, the mean over request turns of each turn's mean, is our "τ turn-mean".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from specbench_cli.analysis.results import Results, RunGroup
from specbench_cli.core.errors import UsageError, unknown

FORMATS = ("spec-bench", "specdec-bench")
PROFILE_SCHEMA = "1.0"  # specdec_bench speculation_profile.py SCHEMA_VERSION


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise unknown("export format", fmt, FORMATS)


def check_destination(fmt: str, folder: Path) -> None:
    """The export's folder can be one: checked before any table is printed or written."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--export {fmt} {folder}: it is a file; name a folder for the exported files")


def check_exportable(results: Results, fmt: str) -> None:
    """Refuse, in one line, runs that lack what the format needs (before anything is written)."""
    check_format(fmt)
    if not results.groups:
        raise UsageError(f"--export {fmt}: no run records found to export")
    for g in results.groups:
        missing = [c for c in ("output_text", "decode_ms", "decode_tokens")  # absent, or empty in runs made before it
                   if c not in g.prompts or g.prompts[c].isna().all()]
        if not len(g.rounds) or "emitted" not in g.rounds:
            missing.append("rounds (accepted lengths)")
        if missing:
            raise UsageError(f"--export {fmt}: {', '.join(str(d) for d in g.dirs)} has no {', '.join(missing)}")


def export(results: Results, fmt: str, folder: Path) -> list[Path]:
    """Write `results` in format `fmt` under `folder` (checked by `check_exportable`); returns the files, or for
    specdec-bench the folders."""
    from specbench_cli.datasets import dataset_slug

    write = spec_bench_file if fmt == "spec-bench" else specdec_bench_folder
    written = []
    for g in results.groups:  # a folder per dataset, as Spec-Bench keeps data/<benchmark>/model_answer/
        where = folder / dataset_slug(g.info["settings"]["dataset"])
        try:
            where.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UsageError(f"cannot create export folder {where}: {err.strerror}") from None
        written.append(write(g, where))
    return written


def file_name(group: RunGroup) -> str:
    """Spec-Bench's answer-file naming: model, method, dtype and temperature."""
    s = group.info["settings"]
    name = f"{s['model']}-{group.label}-{s.get('dtype', 'float32')}-temperature-{float(s.get('temperature', 0)):.1f}"
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", name) + ".jsonl"


def spec_bench_file(group: RunGroup, folder: Path) -> Path:
    """One group's answer file: a line per prompt and pass, turns in order."""
    path = folder / file_name(group)
    prompts, rounds = group.prompts, group.rounds  # loaded records always carry `repeat` (records._LATER)
    steps = {key: list(g.sort_values("round").emitted.astype(int))
             for key, g in rounds.groupby(["prompt_id", "turn", "repeat"], sort=False)}
    lines = []
    for (prompt_id, repeat), turns in prompts.sort_values(["repeat", "index", "turn"]).groupby(
            ["prompt_id", "repeat"], sort=False):
        lines.append(json.dumps(_answer(group, prompt_id, int(repeat), turns, steps)))
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _answer(group: RunGroup, prompt_id: str, repeat: int, turns: pd.DataFrame, steps: dict) -> dict:
    s = group.info["settings"]
    accept = [n for t in turns.turn for n in steps.get((prompt_id, t, repeat), [])]
    choice = {"index": 0, "turns": [str(t) for t in turns.output_text],
              "decoding_steps": [int(r) for r in turns.rounds], "new_tokens": [int(n) for n in turns.decode_tokens],
              "wall_time": [float(ms) / 1e3 for ms in turns.decode_ms], "accept_lengths": accept}
    return {"question_id": int(prompt_id) if str(prompt_id).isdigit() else prompt_id,
            "category": str(turns.category.iloc[0]), "answer_id": f"{turns.run.iloc[0]}-{prompt_id}-{repeat}",
            "model_id": f"{s['model']}-{group.label}", "choices": [choice], "tstamp": group.info.get("started", "")}


def speed_py_notes(results: Results) -> list[str]:
    """For each baseline exported to spec-bench: the tokens/s Spec-Bench's speed.py will read for it (it
    re-tokenizes each turn's answer text and takes one token off per turn, for the BOS its Llama tokenizers add),
    against ours (the decode tokens the run counted), and so how far each speedup it prints is from the report's."""
    lines, tokenizers = [], {}
    for g in results.groups:
        if g.method != "baseline" or g.second_of_pair:
            continue
        settings = g.info["settings"]
        try:
            which = (settings["model"], settings.get("target"))  # one load per tokenizer, not per baseline
            if which not in tokenizers:
                tokenizers[which] = _tokenizer(settings)
            tokenizer = tokenizers[which]
        except Exception as err:  # a hub tokenizer offline, a folder gone: say so, the export stands
            lines.append(f"{g.label}: cannot compute what speed.py reads for this baseline ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''})")
            continue
        theirs, ours = speed_py_rates(g.prompts, tokenizer)
        if theirs != theirs or ours != ours or not ours:
            continue
        lines.append(f"{g.label}: speed.py reads this baseline at {theirs:.2f} tok/s (answers re-tokenized, one "
                     f"token off per turn), the report at {ours:.2f} (decode tokens counted): every speedup it "
                     f"prints over this file is {ours / theirs:.3f}x the report's")
    return lines


def speed_py_rates(prompts: pd.DataFrame, tokenizer) -> tuple[float, float]:
    """(speed.py's baseline tokens/s, ours): the mean over answer lines (a prompt in one pass) of tokens over
    decode seconds, tokens counted as speed.py counts a baseline's (`len(tokenizer(turn).input_ids) - 1` per turn)
    and as the run did."""
    theirs, ours = [], []
    for _, turns in prompts.groupby(["prompt_id", "repeat"], sort=False):
        seconds = float(turns.decode_ms.sum()) / 1e3
        if seconds <= 0:
            continue
        counted = sum(len(tokenizer(str(text)).input_ids) - 1 for text in turns.output_text)
        theirs.append(counted / seconds)
        ours.append(float(turns.decode_tokens.sum()) / seconds)
    return (sum(theirs) / len(theirs), sum(ours) / len(ours)) if ours else (float("nan"), float("nan"))


def _tokenizer(settings: dict):
    """The run's target's tokenizer (the one speed.py is given)."""
    from transformers import AutoTokenizer

    from specbench_cli.loading import checkpoint_location
    from specbench_cli.models import get_model_spec

    spec = get_model_spec(settings["model"], settings.get("target"))
    return AutoTokenizer.from_pretrained(checkpoint_location(spec))


# ---------------------------------------------------------------------------------------------- specdec-bench
def specdec_bench_folder(group: RunGroup, folder: Path) -> Path:
    """One group's acceptance_rate.json, timing.json and, where it drafted, speculation_profile.json (each as
    specdec_bench writes them: the first two a list holding one record)."""
    out = folder / file_name(group).removesuffix(".jsonl")
    out.mkdir(parents=True, exist_ok=True)
    acceptance = acceptance_record(group)
    (out / "acceptance_rate.json").write_text(json.dumps([acceptance], indent=4))
    (out / "timing.json").write_text(json.dumps([timing_record(group)], indent=4))
    if group.rounds.tree_size.gt(0).any():  # as specdec_bench: a run that never drafted has no draft to describe
        (out / "speculation_profile.json").write_text(json.dumps(profile(group, acceptance), indent=2))
    return out


def acceptance_record(group: RunGroup) -> dict:
    """`AcceptanceRate.out`: per request (prompt, and pass where there are several) and turn the mean tokens per
    step, their mean, the histogram of tokens per step, and its conditional and joint rates by length."""
    rounds = group.rounds
    several = rounds.repeat.nunique() > 1
    per_request: dict[str, dict[str, float]] = {}
    lengths: dict[int, int] = {}
    for (prompt_id, repeat, turn), g in rounds.groupby(["prompt_id", "repeat", "turn"], sort=True):
        emitted = g.emitted.astype(int)
        request = f"{prompt_id}-{repeat}" if several else str(prompt_id)
        per_request.setdefault(request, {})[str(turn)] = float(emitted.mean())
        for n, count in emitted.value_counts().items():
            lengths[int(n)] = lengths.get(int(n), 0) + int(count)
    means = [al for turns in per_request.values() for al in turns.values()]
    conditional, joint = length_rates(lengths)
    return {"Request_AL": per_request, "Average_AL": sum(means) / len(means),
            "Acceptance_Length_Histogram": {str(k): v for k, v in sorted(lengths.items())},
            "Conditional_Acceptance_Rate": {str(k): v for k, v in conditional.items()},
            "Joint_Acceptance_Rate": {str(k): v for k, v in joint.items()}}


def length_rates(lengths: dict[int, int]) -> tuple[dict[int, float], dict[int, float]]:
    """specdec_bench's rates from a histogram of tokens per step, over the lengths seen in ascending order: the
    joint rate at length k is the share of steps of length >= k, the conditional rate that share over the one at
    the previous length seen (1 at the shortest)."""
    total = sum(lengths.values())
    conditional, joint = {}, {}
    remaining, previous = total, 1.0
    for k in sorted(lengths):
        share = remaining / total
        conditional[k], joint[k] = share / previous, share
        previous, remaining = share, remaining - lengths[k]
    return conditional, joint


def timing_record(group: RunGroup) -> dict:
    """`Timing.out`: output tokens/s of the run, and per request (prompt turn) the end-to-end time, TTFT, the time
    of each step (the first being TTFT, as specdec_bench takes differences of token times from the request's
    start), the generation tokens/s after the first token, and the output tokens."""
    from specbench_cli.analysis.scaling import throughput

    prompts, rounds = group.prompts, group.rounds
    walls = {k: list(g.sort_values("round").wall_ms / 1e3)
             for k, g in rounds.groupby(["prompt_id", "repeat", "turn"], sort=False)}
    steps = [s for r in prompts.itertuples() for s in [r.ttft_ms / 1e3, *walls.get((r.prompt_id, r.repeat, r.turn), [])]]
    generation = prompts[prompts.decode_ms > 0]
    return {"Output TPS": throughput(group), "Output TPS/gpu": throughput(group),
            "E2E Request Time": statistics((prompts.ttft_ms + prompts.decode_ms) / 1e3),
            "TTFT Time": statistics(prompts.ttft_ms / 1e3), "Request Generation Step Time": statistics(steps),
            "Request Generation Tokens Per Second": statistics(generation.decode_tokens / (generation.decode_ms / 1e3)),
            "Number of Output Tokens": statistics(prompts.new_tokens)}


def statistics(values) -> dict:
    """specdec_bench's `compute_statistics`: min, max, mean, std (population) and quartiles, as 4-decimal text."""
    import numpy as np

    data = np.asarray(list(values), dtype=float)
    quartiles = np.percentile(data, [25, 50, 75])
    return {"min": f"{data.min():.4f}", "max": f"{data.max():.4f}", "mean": f"{data.mean():.4f}",
            "std": f"{data.std():.4f}", "quantiles": {str(q): f"{v:.4f}" for q, v in zip((0.25, 0.5, 0.75), quartiles)}}


def profile(group: RunGroup, acceptance: dict) -> dict:
    """speculation_profile.json (schema 1.0) for the group: K is the deepest draft it verified; draft position i
    is tokens-per-step length i + 2 (length 1 = no draft token accepted). The marginal rate at position i is the
    share of steps of length >= i + 2 and the conditional rate that over the one at position i - 1, for every
    position, lengths no step had included (specdec_bench's own projection sets a length no step had to 0, which
    breaks both checks wherever the histogram has a gap)."""
    s = group.info["settings"]
    lengths = {int(k): v for k, v in acceptance["Acceptance_Length_Histogram"].items()}
    total = sum(lengths.values())
    k = max(int(group.rounds.draft_depth.max()), max(lengths) - 1) if lengths else 0
    marginal = [sum(c for n, c in lengths.items() if n >= i + 2) / total for i in range(k)]
    conditional = [m / before if before else 0.0 for m, before in zip(marginal, [1.0, *marginal])]
    per_step = sum(n * c for n, c in lengths.items()) / total
    implied = 1.0 + sum(marginal)
    rounds = group.rounds
    per_category = {str(c): {"mean_accept_length": float(g.emitted.sum() / len(g))} for c, g in rounds.groupby("category")}
    return {"schema_version": PROFILE_SCHEMA, "measured": True, "method": s["method"],
            "draft_checkpoint": group.drafters or None, "target_model": {"model": s["model"], "target": s.get("target")},
            "num_speculative_tokens": k, "block_size": None, "max_supported_k": k,
            "verification_method": "longest_prefix",  # the longest accepted path of the chain or tree
            "conditional_accept_rates": [round(x, 6) for x in conditional],
            "marginal_accept_rates": [round(x, 6) for x in marginal],
            "mean_accept_length": round(per_step, 6),
            "mean_accept_length_per_request": round(acceptance["Average_AL"], 6),
            "accept_length_model": "measured_per_k",  # one budget measured: no claim for another K
            "accept_length_by_k": {str(k): round(per_step, 6)},
            "acceptance_length_histogram": acceptance["Acceptance_Length_Histogram"], "per_category": per_category,
            "measurement_conditions": {key: s.get(key) for key in ("dataset", "engine", "dtype", "temperature",
                                                                    "max_new_tokens", "concurrency", "batch_size")},
            "validation": {
                "mean_consistency": {"implied_mean_accept_length": round(implied, 6),
                                     "reported_mean_accept_length": round(per_step, 6),
                                     "abs_delta": round(abs(implied - per_step), 6), "tolerance": 0.02,
                                     "passed": abs(implied - per_step) <= 0.02},
                "marginal_monotonicity": {"passed": all(b <= a + 1e-9 for a, b in zip(marginal, marginal[1:]))}}}
