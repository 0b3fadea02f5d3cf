"""The papers' evaluation suites, loaded from the Hugging Face hub with `datasets` (pinned where a revision is
known) and normalised to `Prompt`s.

Each entry says where its prompts come from, how a row becomes the user turns, how many prompts the papers
use and which paper category it belongs to. The prompt construction and the subset rule are z-lab/dflash's
(`model/utils.py` `load_and_process_dataset` and `benchmark.py` at its first commit bb48ef9): a dataset
larger than its size is shuffled with seed 0 and cut (`Dataset.shuffle(seed=0).select(range(size))`). The
sizes are WhiFlash's Appendix A table, which equals DFlash's run_benchmark.sh. WhiFlash does not publish
its loader; that it uses DFlash's construction is our assumption, said in `--list`.

Tests never touch the network: `load_hub(name, files=...)` reads a local file in the dataset's real schema
through the same `datasets` builder and the same mapping.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specbench_cli.core.errors import UsageError

# DFlash's math suffix (the same as AIME_SUFFIX in datasets.py)
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
DFLASH = "z-lab/dflash@bb48ef9 model/utils.py"
LCB_REVISION = "0fe84c3912ea0c4d4a78037083943e8f0c4dd505"  # SPEED-Bench's pin of livecodebench (specdec_bench speed.py)


@dataclass(frozen=True)
class HubDataset:
    hub_id: str
    split: str
    revision: str | None  # a hub commit; None = not pinned yet (the README and --list say so)
    category: str  # WhiFlash's: chat, math, coding, agentic
    size: int  # prompts used
    licence: str
    turns: Callable[[dict], list[str]]  # a row's user turns
    config: str | None = None
    files: tuple[str, ...] = ()  # json files of the repo to read instead of its configs (livecodebench)
    source: str = DFLASH  # where the prompt construction comes from


def _alpaca(row: dict) -> list[str]:
    return [f"{row['instruction']}\n\nInput:\n{row['input']}" if row["input"] else row["instruction"]]


def _livecodebench(row: dict) -> list[str]:
    intro = ("You are an expert Python programmer. You will be given a question (problem specification) and will "
             "generate a correct Python program that matches the specification and passes all tests. You will NOT "
             "return anything except for the program")
    if row.get("starter_code"):
        fmt, code = "### Format: Use the following code structure:", f"```python\n{row['starter_code']}\n```"
    else:
        fmt, code = "### Format: Write your code in the following format:", "```python\n# YOUR CODE HERE\n```"
    return [f"{intro}\n\n### Question:\n{row['question_content']}\n\n{fmt}\n{code}\n\n"
            "### Answer: (use the provided format with backticks)"]


HUB: dict[str, HubDataset] = {
    "gsm8k": HubDataset("openai/gsm8k", "test", "cc7b047b6e5bb11b4f1af84efc572db110a51b3c", "math", 128, "MIT",
                        lambda r: [r["question"] + BOXED], config="main"),
    "math500": HubDataset("HuggingFaceH4/MATH-500", "test", "6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be", "math", 128,
                          "MIT (MATH, PRM800K)", lambda r: [r["problem"] + BOXED]),
    "aime24-h4": HubDataset("HuggingFaceH4/aime_2024", "train", "2fe88a2f1091d5048c0f36abc874fb997b3dd99a", "math", 30,
                            "none stated (problems © MAA)", lambda r: [r["problem"] + BOXED]),
    "aime25-matharena": HubDataset("MathArena/aime_2025", "train", None, "math", 30, "CC BY-NC-SA 4.0 (MathArena)",
                                   lambda r: [r["problem"] + BOXED]),
    "alpaca": HubDataset("tatsu-lab/alpaca", "train", None, "chat", 128, "CC BY-NC 4.0", _alpaca),
    "mt-bench-prompts": HubDataset("HuggingFaceH4/mt_bench_prompts", "train", None, "chat", 80,
                                   "Apache-2.0 (FastChat's MT-Bench)", lambda r: list(r["prompt"])),
    "humaneval": HubDataset("openai/openai_humaneval", "test", "7dce6050a7d6d172f3cc5c32aa97f52fa1a2e544", "coding", 164,
                            "MIT", lambda r: ["Write a solution to the following problem and make sure that it passes "
                                              f"the tests:\n```python\n{r['prompt']}\n```"]),
    "mbpp": HubDataset("google-research-datasets/mbpp", "test", "4bb6404fdc6cacfda99d4ac4205087b89d32030c", "coding", 128,
                       "CC BY 4.0", lambda r: [r["prompt"]], config="sanitized"),
    "livecodebench": HubDataset("livecodebench/code_generation_lite", "test", LCB_REVISION, "coding", 128,
                                "see the dataset card", _livecodebench,
                                files=tuple(f"test{n}.jsonl" for n in ("", "2", "3", "4", "5", "6"))),
    "swe-bench": HubDataset("princeton-nlp/SWE-bench_Lite", "test", None, "agentic", 128, "see the dataset card",
                            lambda r: [f"Problem Statement:\n{r['problem_statement']}\nPlease fix the issue described above."]),
}

# A paper's suite, run as one dataset (--dataset whiflash-math): each prompt's subtask is its dataset.
# WhiFlash's categories also hold UltraChat, WildChat (chat), Tau-Bench, AgentBench and AgentInstruct
# (agentic), whose prompt construction no released code gives: not registered yet.
GROUPS: dict[str, tuple[str, ...]] = {
    "whiflash-chat": ("mt-bench-prompts", "alpaca"),
    "whiflash-math": ("gsm8k", "math500", "aime24-h4", "aime25-matharena"),
    "whiflash-coding": ("humaneval", "mbpp", "livecodebench"),
    "whiflash-agentic": ("swe-bench",),
}
GROUPS["whiflash-all"] = tuple(d for g in list(GROUPS.values()) for d in g)
GROUPS["dflash-suite"] = GROUPS["whiflash-all"]  # DFlash's run_benchmark.sh: the same ten


def load_hub(name: str, files: list[Path] | None = None) -> list[tuple[str, str, list[str]]]:
    """(row id, category, turns) for the dataset's selected prompts; `files` reads local files in the hub's
    schema instead (tests)."""
    entry = HUB[name]
    rows = _select(_read(name, entry, files), entry.size)
    ids = ("task_id", "instance_id", "question_id", "unique_id", "id", "problem_idx", "prompt_id")
    out = []
    for row in rows:
        key = next((k for k in ids if row.get(k) is not None), "_row")
        out.append((str(row[key]), entry.category, entry.turns(row)))
    return out


def _read(name: str, entry: HubDataset, files: list[Path] | None):
    try:
        import datasets
    except ImportError:
        raise UsageError(f"dataset '{name}' needs the datasets package: pip install datasets") from None
    datasets.disable_progress_bars()
    try:
        if files is not None:
            builder = "parquet" if files[0].suffix == ".parquet" else "json"
            data = datasets.load_dataset(builder, data_files={"test": [str(f) for f in files]}, split="test")
        elif entry.files:
            base = f"https://huggingface.co/datasets/{entry.hub_id}/resolve/{entry.revision or 'main'}/"
            data = datasets.load_dataset("json", data_files={"test": [base + f for f in entry.files]}, split="test")
        else:
            data = datasets.load_dataset(entry.hub_id, entry.config, split=entry.split, revision=entry.revision)
    except Exception as err:  # offline, gated, moved: `datasets` raises many kinds
        raise UsageError(_unavailable(name, entry, err)) from None
    return data.add_column("_row", list(range(len(data))))


def _select(data, size: int) -> list[dict]:
    """DFlash's subset rule: the first `size` rows after a seed-0 shuffle, when the dataset is larger."""
    if len(data) > size:
        data = data.shuffle(seed=0).select(range(size))
    return data.to_list()


def _unavailable(name: str, entry: HubDataset, err: Exception) -> str:
    where = f"{entry.hub_id}@{(entry.revision or 'main')[:12]}"
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
    how = ("it is not in the datasets cache and the hub is off (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE): load it once "
           "with network, or copy a cache that has it (HF_HOME)" if offline else
           f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else 'no detail'}")
    return f"dataset '{name}' ({where}) could not be loaded: {how}"


def cached(entry: HubDataset) -> bool:
    """Whether the hub cache holds any revision of the dataset's repository (a first load needs network)."""
    from huggingface_hub import constants

    return (Path(constants.HF_HUB_CACHE) / f"datasets--{entry.hub_id.replace('/', '--')}").is_dir()
