"""Write `datasets/train/written-tasks.jsonl.xz`: training prompts for the tasks the three vendored sources lack.

The vendored prompts (GSM8K, GPTeacher roleplay and code; datasets/train/SOURCE.md) hold no summarisation,
passage-grounded answering or translation, and drafters trained on them accept least on exactly those
Spec-Bench tasks. This script writes such prompts itself, in Spec-Bench's formats, from text we may ship:

- summarize: "Summarize: " + a passage of 2-5 GPTeacher roleplay responses (prose, MIT).
- rag: a passage of 2-5 responses, one of them the answer to a roleplay instruction, then a newline and that
  instruction (the question follows its passage, as in Spec-Bench's RAG prompts).
- translate: "Translate German to English: " + German the embedded model wrote itself for an English sentence
  of a response (greedy; it is not fluent German, but it is German-looking text in the model's own hand).

Only roleplay rows outside the roleplay source's calibration share are used, so no router calibrates on a
passage a drafter trained on. The output is deterministic (seed 0, greedy, fp32 on CPU).

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/write_task_prompts.py ROLEPLAY_JSON   # long on a CPU

ROLEPLAY_JSON is the upstream GPTeacher roleplay file (datasets/train/SOURCE.md: the project ships only its
prompts, and the passages are made of its responses); its sha256 is checked.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.slim_training_prompts import UPSTREAM  # noqa: E402
from specbench_cli.datasets import DATASET_DIR, write_vendored  # noqa: E402
from specbench_cli.loading import load_model  # noqa: E402
from specbench_cli.models import get_model_spec  # noqa: E402
from specbench_cli.commands.train.distill import calibration_prompts, generate, row_prompt  # noqa: E402

OUT = DATASET_DIR / "train" / "written-tasks.jsonl.xz"
COUNTS = {"summarize": 640, "rag": 640, "translate": 320}
PASSAGE_RESPONSES = (2, 5)  # responses per passage: ~1,200-3,000 characters, as Spec-Bench's ~3,000
GERMAN_WORDS = {"der", "die", "das", "und", "ist", "ein", "eine", "nicht", "ich", "wir", "mit", "von", "zu", "sie"}


def roleplay_rows(upstream: Path) -> list[dict]:
    """Roleplay rows with prose responses whose prompt is not among the calibration prompts."""
    sha = UPSTREAM["roleplay-simple-deduped-roleplay-instruct.json"][0]
    if hashlib.sha256(upstream.read_bytes()).hexdigest() != sha:
        sys.exit(f"{upstream}: not the upstream roleplay file datasets/train/SOURCE.md names (sha256 differs)")
    rows = json.loads(upstream.read_text())
    held = set(calibration_prompts(10**6))
    return [r for r in rows if row_prompt(r, "instruction") not in held and len(r["response"]) >= 200]


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def passage(rng: random.Random, rows: list[dict], must: dict | None = None) -> str:
    picked = rng.sample(rows, rng.randint(*PASSAGE_RESPONSES))
    if must is not None and must not in picked:
        picked[rng.randrange(len(picked))] = must
    return " ".join(one_line(r["response"]) for r in picked)


def summarize(rng: random.Random, rows: list[dict], n: int) -> list[str]:
    return ["Summarize: " + passage(rng, rows) for _ in range(n)]


def rag(rng: random.Random, rows: list[dict], n: int) -> list[str]:
    askable = [r for r in rows if not r["input"] and len(r["instruction"]) <= 250]
    return [passage(rng, rows, must=r) + "\n" + one_line(r["instruction"]) for r in rng.sample(askable, n)]


def english_sentences(rng: random.Random, rows: list[dict], n: int) -> list[str]:
    sentences = {s for r in rows for s in re.split(r"(?<=[.!?])\s+", one_line(r["response"]))
                 if 6 <= len(s.split()) <= 30 and ":" not in s and '"' not in s}
    return rng.sample(sorted(sentences), n)


def translate(rng: random.Random, rows: list[dict], n: int) -> list[str]:
    """German the embedded model writes for English sentences; replies that are not German-looking are
    dropped. Punctuation is spaced as in Spec-Bench's (tokenized WMT14) sources."""
    torch.set_num_threads(2)
    model = load_model(get_model_spec("smollm2-135m"), torch.device("cpu"), torch.float32)
    english = english_sentences(rng, rows, 2 * n)
    sequences, prompt_lens = generate(model, [f"Translate English to German: {s}" for s in english], 64, 16)
    german = []
    for seq, start in zip(sequences, prompt_lens):
        text = one_line(model.tokenizer.decode(seq[start:], skip_special_tokens=True))
        words = set(re.findall(r"\w+", text.lower()))
        if len(words & GERMAN_WORDS) >= 2 and "translat" not in text.lower() and "übersetz" not in text.lower():
            german.append(re.sub(r"\s*([,.!?;:])", r" \1", text))
    if len(german) < n:
        raise SystemExit(f"only {len(german)} German replies of {2 * n}; lower COUNTS['translate']")
    return ["Translate German to English: " + g for g in german[:n]]


def main() -> None:
    rng = random.Random(0)
    rows = roleplay_rows(Path(sys.argv[1]))
    written = {"summarize": summarize(rng, rows, COUNTS["summarize"]), "rag": rag(rng, rows, COUNTS["rag"]),
               "translate": translate(rng, rows, COUNTS["translate"])}
    lines = [json.dumps({"task": task, "prompt": p}, ensure_ascii=False) for task, ps in written.items() for p in ps]
    write_vendored(OUT, ("\n".join(lines) + "\n").encode("utf-8"))
    print(f"wrote {len(lines)} prompts to {OUT}")


if __name__ == "__main__":
    main()
