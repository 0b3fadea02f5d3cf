#!/usr/bin/env python3
"""Render the measured tables of README.md and docs/*.md from the records under benchmarks/results/.

A page marks a table's place with two comments, and everything between them is this script's:

    <!-- table:NAME -->
    ...
    <!-- /table -->

`python scripts/render_docs_tables.py` rewrites every marked block from its records (each block ends with links to
the records it was rendered from); `--check` changes nothing and exits 1 naming each block that is out of date,
or a block whose NAME this script does not know. Standard library only: no torch, no pandas.

A record is one JSON object: `what`, `command`, `commit`, `machine`, `date` and the numbers (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BLOCK = re.compile(r"^(<!-- table:(?P<name>[A-Za-z0-9_-]+) -->\n)(?P<body>.*?)^(<!-- /table -->)", re.S | re.M)
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)  # markers shown inside a code block are examples, not tables
MISSING = "—"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def load(record: str) -> dict:
    return json.loads((RESULTS / record).read_text(encoding="utf-8"))


# --------------------------------------------------------------------------------------------- number formats
def num(x, digits: int = 2) -> str:
    return MISSING if x is None else f"{x:.{digits}f}"


def interval(pair, digits: int = 2) -> str:
    return "" if not pair else f" [{pair[0]:.{digits}f}, {pair[1]:.{digits}f}]"


def speedup(x, pair=None, bold_above: float | None = None) -> str:
    if x is None:
        return MISSING
    text = f"{x:.2f}"
    if bold_above is not None and pair and pair[0] > bold_above:
        text = f"**{text}**"
    return text + interval(pair)


def percent(x) -> str:
    return f"{100 * x:.1f} %"


def markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


# --------------------------------------------------------------------------------------------- the tables
Renderer = Callable[[list[dict], Callable[[str], str]], list[str]]
TABLES: dict[str, tuple[tuple[str, ...], Renderer]] = {}


def table(name: str, *records: str):
    """Register a table: the records it reads (paths under benchmarks/results/) and its rendering."""
    def register(fn: Renderer) -> Renderer:
        TABLES[name] = (records, fn)
        return fn
    return register


@table("quickstart", "readme/quickstart.json")
def _quickstart(recs, link):
    r = recs[0]["results"]
    return markdown(["method", "tokens/s [95 % CI]", "τ", "speedup [95 % CI, paired]"], [
        ["baseline", num(r["baseline"]["tokens_per_s"], 1) + interval(r["baseline"]["interval95"], 1), "1.00", MISSING],
        ["suffix", num(r["suffix"]["tokens_per_s"], 1), num(r["suffix"]["tau"]),
         speedup(r["suffix"]["speedup"], r["suffix"]["interval95"])]])


@table("methods-cpu", "readme/methods-list-l.json", "readme/methods-list-h.json")
def _methods(recs, link):
    rows = []
    for rec, name, path in zip(recs, ("L", "H"), TABLES["methods-cpu"][0]):
        for r in rec["rows"]:
            rows.append([f"`{r['method']}`", r["budget"], num(r["tau"]), num(r["tokens_per_s"], 1),
                         speedup(r.get("speedup"), r.get("interval95"), bold_above=1.0), f"[{name}]({link(path)})"])
    return markdown(["method", "budget", "τ", "tokens/s", "speedup [95 % CI]", "list"], rows)


def _tune_cells(side: dict) -> str:
    return f"{num(side['tau'])}, {num(side['predicted'])}, {speedup(side['measured'], side.get('interval95'))}"


@table("tune-cpu", "readme/tune-eagle3.json", "readme/tune-eagle3-dflash.json")
def _tune(recs, link):
    eagle3 = next(r for r in recs[0]["rows"] if r["method"] == "eagle3")
    dflash = next(r for r in recs[1]["rows"] if r["method"] == "dflash")
    rows = [[f"`{r['method']}`", _tune_cells(r["paper"]), f"`{r['tuned_budget'].split(' (')[0]}`",
             _tune_cells(r["tuned"]), f"[record]({link(path)})"]
            for r, path in ((eagle3, TABLES["tune-cpu"][0][0]), (dflash, TABLES["tune-cpu"][0][1]))]
    return markdown(["method", "paper budget: τ, predicted ×, measured × [95 % CI]", "chosen budget",
                     "chosen: τ, predicted ×, measured × [95 % CI]", "record"], rows)


@table("tune-per-batch", "readme/tune-per-batch.json")
def _tune_batch(recs, link):
    r = recs[0]
    rows = [[f"ours, batch {x['batch_size']}", str(x["chosen_k"]),
             f"{num(x['predicted'])}; {speedup(x['measured'], x['interval95'])}",
             speedup(x["paper_k10"], x["paper_interval95"])] for x in r["ours"]]
    rows += [[f"vLLM, {x['concurrency']} in flight", str(x["chosen_k"]), f"{MISSING}; "
              f"{speedup(x['measured'], x['interval95'])}", speedup(x["paper_k10"], x["paper_interval95"])]
             for x in r["vllm"]]
    return markdown(["engine, level", "chosen K", "its × (predicted; measured [95 % CI])", "paper's K = 10 ×"], rows)


@table("engine-decode", "readme/engine-decode.json")
def _engine(recs, link):
    r = recs[0]
    d, t1, chain, v = r["decode_tokens_per_s"], r["t1_ms"], r["chain_c"], r["vs_vllm"]

    def curve(c: dict) -> str:
        return " / ".join(num(c[k]) for k in ("2", "8", "16", "64"))

    return markdown(["", "plain target", "batch-invariant target"], [
        ["decode tokens/s (`generate()`: " + num(d["generate()"], 1) + ")", num(d["plain"], 1), num(d["batch-invariant"], 1)],
        ["one-token forward t(1), ms", num(t1["plain"]), num(t1["batch-invariant"])],
        ["chain verify c(2) / c(8) / c(16) / c(64)", curve(chain["plain"]), curve(chain["batch-invariant"])],
        [f"ours over vLLM's CPU engine, interleaved ({num(v['ours_tokens_per_s'], 1)} against "
         f"{num(v['vllm_tokens_per_s'], 1)} tokens/s)", num(v["ratio_median"]) + f" (range {num(v['ratio_range'][0])}"
         f"–{num(v['ratio_range'][1])})", MISSING],
        ["share of the measured read roofline", percent(r["read_roofline"]["share"]), MISSING]])


@table("kernel-ab", "readme/kernel-ab-row-attention.json", "readme/kernel-ab-decoder-layers.json")
def _kernels(recs, link):
    rows = []
    for rec, (label, key), path in zip(recs, (("row attention kernel, against PyTorch attention", "kernel_over_without"),
                                               ("decoder layers in one call, against PyTorch layers",
                                                "one_call_over_pytorch")), TABLES["kernel-ab"][0]):
        for target in ("plain", "batch-invariant"):
            x = rec[key][target]
            rows.append([f"[{label}]({link(path)})", target, f"{num(x['decode_ms'][0])} → {num(x['decode_ms'][1])}",
                         num(x["decode"], 3), num(x["verify_8"], 3), num(x["verify_16"], 3), num(x["verify_64"], 3)])
    return markdown(["change", "target", "decode ms", "decode ×", "verify of 8 ×", "of 16 ×", "of 64 ×"], rows)


@table("exactness-cost", "readme/kernel-ab-decoder-layers.json")
def _exactness(recs, link):
    x = recs[0]["invariant_over_plain"]["one call"]
    return markdown(["", "decode", "verify of 8 rows", "of 16", "of 64"], [
        ["batch-invariant time / plain time", num(x["decode"], 3) + f" (range {num(x['decode_range'][0], 3)}–"
         f"{num(x['decode_range'][1], 3)})", num(x["verify_8"], 3), num(x["verify_16"], 3), num(x["verify_64"], 3)]])


@table("batches-cpu", "readme/batches-cpu.json")
def _batches(recs, link):
    rows = [[str(x["batch_size"]), num(x["baseline"], 1)] +
            [f"{num(x[m], 1)} ({num(x[m + '_x'])})" for m in ("suffix", "eagle3", "dart")] for x in recs[0]["rows"]]
    return markdown(["batch size", "baseline tokens/s", "suffix tokens/s (×)", "eagle3 tokens/s (×)",
                     "dart tokens/s (×)"], rows)


@table("vllm-concurrency", "readme/vllm-concurrency.json")
def _concurrency(recs, link):
    methods = ("suffix", "eagle3", "dflash")
    rows = [[str(x["concurrency"]), num(x["baseline"], 1)] +
            [f"{num(x[m], 1)} ({num(x[m + '_x'])}, τ {num(x[m + '_tau'])})" for m in methods] for x in recs[0]["rows"]]
    return markdown(["requests in flight", "baseline tokens/s", "suffix tokens/s (×, τ)",
                     "eagle3, a chain of 9 (×, τ)", "dflash (×, τ)"], rows)


@table("vllm-hvd", "readme/vllm-hvd.json")
def _hvd(recs, link):
    def pair(p):
        return f"{num(p[0])}, {num(p[1])}"
    rows = [[x["dataset"], num(x["baseline"], 1), pair(x["suffix"]), pair(x["eagle3"]), pair(x["hvd"]),
             num(x["hvd_over_eagle3"]), num(x["hvd_over_suffix"]), percent(x["cache_steps"]), pair(x["hvd_freq"])]
            for x in recs[0]["rows"]]
    return markdown(["dataset", "baseline tokens/s", "suffix (τ, ×)", "EAGLE-3 chain of 9 (τ, ×)", "hvd (τ, ×)",
                     "hvd ÷ EAGLE-3", "hvd ÷ suffix", "cache steps", "hvd-freq (τ, ×)"], rows)


@table("vllm-whiflash", "readme/vllm-whiflash.json")
def _whiflash(recs, link):
    r = recs[0]
    rows = [[f"baseline ({num(r['baseline_tokens_per_s'], 1)} tokens/s)", "1.00", MISSING, MISSING]]
    rows += [[x["method"], num(x["tau"]), num(x["speedup"]),
              percent(x["eagle3_steps"]) if "eagle3_steps" in x else MISSING] for x in r["rows"]]
    return markdown(["method", "τ", "speedup", "steps drafted by EAGLE-3"], rows)


@table("vllm-parity", "vllm-parity/cpu-float32-methods-defaults.json")
def _vllm_parity(recs, link):
    return markdown(["method", "ours/vLLM [95 % CI, paired]", "ours tokens/s", "vLLM tokens/s", "τ ours / vLLM"], [
        [m["method"], speedup(m["ours_over_vllm"], m["interval95"]), num(m["specbench"]["tokens_per_s"], 1),
         num(m["vllm"]["tokens_per_s"], 1), f"{num(m['specbench']['tau'])} / {num(m['vllm']['tau'])}"]
        for m in recs[0]["methods"]])


DRAFTER_PARITY = {"F.linear": "vllm-parity/cpu-float32-eagle3-chain-native-bf16-cpu.json",
                  "packed": "vllm-parity/cpu-float32-packed-drafters-native-bf16-cpu.json",
                  "+ stacked, cached": "vllm-parity/cpu-float32-stacked-cached-drafters-native-bf16-cpu.json"}


@table("vllm-parity-drafters", *DRAFTER_PARITY.values())
def _vllm_parity_drafters(recs, link):
    return markdown(["method", "drafter", "ours/vLLM [95 % CI, paired]", "ours, vLLM tokens/s", "draft ms a round",
                     "record"], [
        [m["method"], label, speedup(m["ours_over_vllm"], m["interval95"]),
         f"{num(m['specbench']['tokens_per_s'], 1)}, {num(m['vllm']['tokens_per_s'], 1)}",
          num(m["specbench"]["phases_ms"]["draft_ms"], 1), f"[record]({link(name)})"]
        for (label, name), r in zip(DRAFTER_PARITY.items(), recs) for m in r["methods"]])


@table("projection", "projection/qwen3-8b-mt-bench-cpu.json")
def _projection(recs, link):
    methods = recs[0]["methods"]
    base = methods["baseline"]
    rows = [["baseline", MISSING, MISSING, "1.00", num(base["tokens_per_s"], 2) + interval(base["tokens_per_s_95"]),
             "1.00", MISSING, num(base["phases_ms"]["verify_ms"], 0)]]
    for name, m in methods.items():
        if name == "baseline":
            continue
        ph = m["phases_ms"]
        rows.append([name, f"{m['draft_tokens']}", num(m["paper_tau"]) + f" (rate {m['synthetic_rate']:.3f})",
                     num(m["tau"]), num(m["tokens_per_s"], 2) + interval(m["tokens_per_s_95"]),
                     speedup(m["speedup"], m["speedup_95"]), num(ph.get("draft_ms"), 0), num(ph.get("verify_ms"), 0)])
    return markdown(["method", "draft (chain)", "paper τ (set rate)", "τ here", "tokens/s [95 % CI]",
                     "speedup [95 % CI, paired]", "draft ms", "verify ms"], rows)


@table("paired-runs", "readme/paired-runs.json")
def _paired(recs, link):
    r = recs[0]
    inter, seq = r["interleaved"], r["sequential"]
    rows = [["baseline tokens/s", num(inter["baseline"]["tokens_per_s"]) + interval(inter["baseline"]["interval95"], 1),
             num(seq["baseline"]["tokens_per_s"]) + interval(seq["baseline"]["interval95"], 1)]]
    rows += [[f"{m} speedup", speedup(inter[m]["speedup"], inter[m]["interval95"]),
              speedup(seq[m]["speedup"], seq[m]["interval95"])] for m in ("suffix", "eagle3")]
    return markdown(["", "interleaved list (paired intervals)", "one run after another (unpaired)"], rows)


# --------------------------------------------------------------------------------------------- the pages
def render(name: str, page: Path) -> str:
    if name not in TABLES:
        raise KeyError(f"{page.relative_to(ROOT)}: no table named {name!r} (known: {', '.join(sorted(TABLES))})")
    records, fn = TABLES[name]

    def link(record: str) -> str:
        return Path(os.path.relpath(RESULTS / record, page.parent)).as_posix()

    lines = fn([load(r) for r in records], link)
    sources = ", ".join(f"[`{Path(r).name}`]({link(r)})" for r in records)
    return "\n".join(lines) + f"\n\nRendered by `scripts/render_docs_tables.py` from {sources}.\n"


def rendered(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    fences = [m.span() for m in FENCE.finditer(text)]

    def replace(m: re.Match) -> str:
        if any(start <= m.start() < end for start, end in fences):
            return m.group(0)
        return m.group(1) + render(m.group("name"), page) + m.group(4)

    return BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is out of date")
    args = parser.parse_args(argv)
    stale = []
    for page in pages():
        try:
            new = rendered(page)
        except (KeyError, FileNotFoundError) as err:
            print(err, file=sys.stderr)
            return 1
        if new != page.read_text(encoding="utf-8"):
            stale.append(page.relative_to(ROOT).as_posix())
            if not args.check:
                page.write_text(new, encoding="utf-8")
    if args.check and stale:
        print("out of date (run python scripts/render_docs_tables.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    print(("rewrote: " + ", ".join(stale)) if stale and not args.check else "every table is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
