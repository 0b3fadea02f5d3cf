"""The papers' evaluation suites, loaded from the Hugging Face hub with `datasets` (pinned where a revision is
known) and normalised to `Prompt`s.

Each entry says where its prompts come from, how a row becomes the user turns, how many prompts the papers
use and which paper category it belongs to. The prompt construction and the subset rule are z-lab/dflash's
(`model/utils.py` `load_and_process_dataset` and `benchmark.py` at its first commit, which `DFLASH` names): a dataset
larger than its size is shuffled with seed 0 and cut (`Dataset.shuffle(seed=0).select(range(size))`). The
sizes are WhiFlash's Appendix A table, which equals DFlash's run_benchmark.sh. WhiFlash does not publish
its loader; that it uses DFlash's construction is our assumption, said in `--list`. Datasets no released
code constructs (WhiFlash's UltraChat, WildChat, AgentInstruct; DART's CodeAlpaca; HVD's sets) have
`source=OURS`: the construction is ours, and `--list` and docs/datasets.md say so.

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
# Revisions seen pinned in public code (not checked against the hub from here): WildChat-1M's by scripts that
# download its shards, SWE-bench Verified's by an evaluation harness.
WILDCHAT_REVISION = "7d6490e462285cf85d91eabea0f9a954fbddcd1f"
SWE_VERIFIED_REVISION = "78f471bf655a3137b2e8a75af1501690ec009ec3"


@dataclass(frozen=True)
class HubDataset:
    hub_id: str
    split: str
    revision: str | None  # a hub commit; None = not pinned yet (docs/datasets.md and --list say so)
    category: str  # WhiFlash's: chat, math, coding, agentic
    size: int  # prompts used
    licence: str
    turns: Callable[[dict], list[str]]  # a row's user turns
    config: str | None = None
    files: tuple[str, ...] = ()  # files of the repo (json lines or parquet) read instead of its configs
    source: str = DFLASH  # where the prompt construction comes from ("ours" where no paper gives one)
    keep: Callable[[dict], bool] | None = None  # rows eligible before the subset is drawn (None: all)


@dataclass(frozen=True)
class Member:
    """A dataset inside a paper's suite, with the paper's own size and category where they differ."""

    name: str
    size: int | None = None  # None: the dataset's
    category: str | None = None

    @property
    def entry(self) -> HubDataset:
        return HUB[self.name]


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


def _with_paragraphs(paragraphs: list[tuple[str, str]], question: str) -> list[str]:
    """Multi-hop QA: every given paragraph as "title: text", then the question (ours)."""
    text = "\n\n".join(f"{title}: {body}" for title, body in paragraphs)
    return [f"{text}\n\nAnswer the question using the paragraphs above.\nQuestion: {question}"]


def _hotpotqa(row: dict) -> list[str]:
    context = row["context"]
    return _with_paragraphs([(t, "".join(s)) for t, s in zip(context["title"], context["sentences"])], row["question"])


def _musique(row: dict) -> list[str]:
    return _with_paragraphs([(p["title"], p["paragraph_text"]) for p in row["paragraphs"]], row["question"])


def _first_user_turn(row: dict) -> str:
    return row["conversation"][0]["content"] if row["conversation"] else ""


def _wildchat_keep(row: dict) -> bool:
    """English, not flagged toxic, opened by a non-empty user turn."""
    return row["language"] == "English" and not row["toxic"] and bool(row["conversation"]) \
        and row["conversation"][0]["role"] == "user" and bool(_first_user_turn(row).strip())


def _agent_turns(row: dict) -> list[str]:
    """The trajectory's first two human turns: the environment's instructions, then the task or first
    observation (its later human turns answer the recorded agent's actions, which our model did not take)."""
    return [c["value"] for c in row["conversations"] if c["from"] == "human"][:2]


OURS = "ours (no published construction; see docs/datasets.md)"
def _swe_bench(row: dict) -> list[str]:
    return [f"Problem Statement:\n{row['problem_statement']}\nPlease fix the issue described above."]

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
                            _swe_bench),
    # WhiFlash's other chat and agentic sets (its Appendix A sizes); no released code gives their prompts.
    "ultrachat": HubDataset("HuggingFaceH4/ultrachat_200k", "test_sft", None, "chat", 80, "MIT",
                            lambda r: [r["prompt"]], source=OURS),
    "wildchat": HubDataset("allenai/WildChat-1M", "train", WILDCHAT_REVISION, "chat", 80, "ODC-BY 1.0",
                           lambda r: [_first_user_turn(r)], files=("data/train-00000-of-00014.parquet",),
                           source=OURS, keep=_wildchat_keep),
    "agentinstruct": HubDataset("THUDM/AgentInstruct", "os+db+alfworld+webshop+kg+mind2web", None, "agentic", 80,
                                "see the dataset card", _agent_turns, source=OURS),
    # DART's CodeAlpaca (its Table 1); size ours
    "codealpaca": HubDataset("sahil2801/CodeAlpaca-20k", "train", None, "coding", 128, "see the dataset card", _alpaca,
                             source=OURS),
    # HVD's further sets (its Table 8; 20 prompts each inside hvd-suite)
    "swe-bench-verified": HubDataset("SWE-bench/SWE-bench_Verified", "test", SWE_VERIFIED_REVISION, "agentic", 128,
                                     "see the dataset card", _swe_bench, source=OURS),
    "magicoder": HubDataset("ise-uiuc/Magicoder-Evol-Instruct-110K", "train", None, "coding", 128,
                            "see the dataset card", lambda r: [r["instruction"]], source=OURS),
    "cnn-dailymail": HubDataset("abisee/cnn_dailymail", "test", None, "summarization", 128, "Apache-2.0",
                                lambda r: [f"Summarize the following news article.\n\n{r['article']}"], config="3.0.0",
                                source=OURS),
    "govreport": HubDataset("ccdv/govreport-summarization", "test", None, "summarization", 128, "see the dataset card",
                            lambda r: [f"Summarize the following government report.\n\n{r['report']}"], source=OURS),
    "hotpotqa": HubDataset("hotpotqa/hotpot_qa", "validation", None, "qa", 128, "CC BY-SA 4.0", _hotpotqa,
                           config="distractor", source=OURS),
    "musique": HubDataset("dgslibisey/MuSiQue", "validation", None, "qa", 128,
                          "CC BY 4.0 (the authors'; the hub copy states none)", _musique, source=OURS),
}


def _members(*names: str, size: int | None = None, category: str | None = None) -> tuple[Member, ...]:
    return tuple(Member(n, size, category) for n in names)


# A paper's suite, run as one dataset (--dataset whiflash-math): each prompt's subtask is its dataset.
# Not registered (no hub copy of the prompts an agent sees without its environment): WhiFlash's Tau-Bench and
# AgentBench; HVD's Delegate-52, FineEdit, RepoBench, BFCL, Spider, 2WikiMultiHopQA, InfiniteBench.
GROUPS: dict[str, tuple[Member, ...]] = {
    "whiflash-chat": _members("mt-bench-prompts", "alpaca", "ultrachat", "wildchat"),
    "whiflash-math": _members("gsm8k", "math500", "aime24-h4", "aime25-matharena"),
    "whiflash-coding": _members("humaneval", "mbpp", "livecodebench"),
    "whiflash-agentic": _members("swe-bench", "agentinstruct"),
}
GROUPS["whiflash-all"] = tuple(m for g in list(GROUPS.values()) for m in g)
GROUPS["dflash-suite"] = _members("mt-bench-prompts", "alpaca", "gsm8k", "math500", "aime24-h4", "aime25-matharena",
                                  "humaneval", "mbpp", "livecodebench", "swe-bench")  # DFlash's run_benchmark.sh
GROUPS["dart-suite"] = _members("mt-bench-prompts", "humaneval", "alpaca", "math500", "codealpaca", "livecodebench",
                                "mbpp")  # DART's Table 1 datasets; sizes are DFlash's (DART states none)
# HVD's Table 8: 20 prompts per dataset, its workload families as categories (the 9 of its 16 sets registered here)
GROUPS["hvd-suite"] = (*_members("swe-bench-verified", "magicoder", "mbpp", size=20, category="code"),
                       *_members("hotpotqa", "musique", size=20, category="multi-hop-qa"),
                       *_members("cnn-dailymail", "govreport", size=20, category="long-context"),
                       *_members("alpaca", "mt-bench-prompts", size=20, category="chat"))


def load_hub(member: Member, files: list[Path] | None = None) -> list[tuple[str, str, list[str]]]:
    """(row id, category, turns) for the dataset's selected prompts; `files` reads local files in the hub's
    schema instead (tests)."""
    entry = member.entry
    data = _read(member.name, entry, files)
    if entry.keep is not None:
        data = data.filter(entry.keep)
    rows = _select(data, member.size or entry.size)
    ids = ("task_id", "instance_id", "question_id", "unique_id", "id", "problem_idx", "prompt_id", "conversation_hash")
    out = []
    for row in rows:
        key = next((k for k in ids if row.get(k) is not None), "_row")
        out.append((str(row[key]), member.category or entry.category, entry.turns(row)))
    return out


def _read(name: str, entry: HubDataset, files: list[Path] | None):
    try:
        import datasets
    except ImportError:
        raise UsageError(f"dataset '{name}' needs the datasets package: pip install datasets") from None
    datasets.disable_progress_bars()
    try:
        if files is not None:
            data = _read_files(datasets, [str(f) for f in files])
        elif entry.files:
            base = f"https://huggingface.co/datasets/{entry.hub_id}/resolve/{entry.revision or 'main'}/"
            data = _read_files(datasets, [base + f for f in entry.files])
        else:
            data = datasets.load_dataset(entry.hub_id, entry.config, split=entry.split, revision=entry.revision)
    except Exception as err:  # offline, gated, moved: `datasets` raises many kinds
        raise UsageError(_unavailable(name, entry, err)) from None
    return data.add_column("_row", list(range(len(data))))


def _read_files(datasets, files: list[str]):
    builder = "parquet" if files[0].endswith(".parquet") else "json"
    return datasets.load_dataset(builder, data_files={"test": files}, split="test")


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
