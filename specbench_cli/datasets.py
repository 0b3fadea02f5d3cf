"""Load the vendored prompt sets (or a user's jsonl) into one normalised `Prompt` shape.

Every prompt has an id, its dataset, a `category` (the file's own label, e.g. `writing`), a `subtask`
(Spec-Bench's six groups: mt_bench, translation, summarization, qa, math_reasoning, rag; the dataset name
for AIME) and its user turns. Multi-turn prompts are decoded turn by turn by the runner.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from specbench_cli.core.errors import UsageError, unknown

DATASET_DIR = Path(__file__).resolve().parent.parent / "datasets"
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
# The usual instruction for AIME in reasoning evaluations (Qwen2.5-Math evaluation's chat prompt).
AIME_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class DatasetFile:
    path: str  # relative to datasets/
    sha256: str  # of the vendored file, as its SOURCE.md gives it


DATASETS: dict[str, DatasetFile] = {
    "spec-bench": DatasetFile("spec_bench/question.jsonl", "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"),
    "mt-bench": DatasetFile("mt_bench/question.jsonl", "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7"),
    "aime24": DatasetFile("aime24/test.jsonl", "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac"),
    "aime25": DatasetFile("aime25/test.jsonl", "b4e273c02d3e7fe1b74b59eae768fc8230bfb0f79539890cb56f4361caac0331"),
}


@dataclass(frozen=True)
class Prompt:
    id: str
    dataset: str
    category: str
    subtask: str
    turns: tuple[str, ...]
    reference: str | None = None


def load_dataset(name: str, base: Path = DATASET_DIR) -> list[Prompt]:
    """A registered name (checksum-verified) or a path to a `.jsonl` file."""
    if name in DATASETS:
        entry = DATASETS[name]
        path = base / entry.path
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != entry.sha256:
            raise UsageError(f"dataset '{name}' failed its checksum ({path}: sha256 {digest[:12]}…, expected {entry.sha256[:12]}…)")
        dataset = name
    elif name.endswith(".jsonl"):
        path = Path(name).expanduser()
        if not path.exists():
            raise UsageError(f"dataset file not found: {name}")
        dataset = path.stem
    else:
        raise unknown("dataset", name, DATASETS)
    rows = _read_jsonl(path)
    return [_normalise(dataset, row, i) for i, row in enumerate(rows)]


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise UsageError(f"{path}:{n}: not valid JSON ({err.msg})") from None
    return rows


def _normalise(dataset: str, row: dict, index: int) -> Prompt:
    """Map the four vendored formats (and user files with the same fields) to a `Prompt`."""
    if dataset.startswith("aime"):
        answer = row.get("answer")
        return Prompt(str(row["id"]), dataset, "math", dataset, (row["problem"] + AIME_SUFFIX,),
                      None if answer is None else str(int(str(answer))))
    turns = row.get("turns") or [row.get(k) for k in ("prompt", "question", "problem") if row.get(k)][:1]
    if not turns or not all(isinstance(t, str) for t in turns):
        raise UsageError(f"{dataset} row {index + 1}: needs 'turns' (a list of strings) or a 'prompt' string")
    category = str(row.get("category", "custom"))
    subtask = "mt_bench" if category in MT_BENCH_CATEGORIES and len(turns) > 1 else category
    ref = row.get("reference")
    reference = json.dumps(ref) if isinstance(ref, list) else ref
    pid = row.get("question_id", row.get("id", index))
    return Prompt(str(pid), dataset, category, subtask, tuple(turns), reference)


def select(prompts: list[Prompt], categories: list[str] | None, limit: int | None) -> list[Prompt]:
    """Filter by category or subtask names, then keep `limit` prompts taken round-robin across subtasks.

    Round-robin keeps every subtask in a small run (Spec-Bench's file is sorted by subtask, so the first
    12 prompts would all be `writing`)."""
    if categories:
        known = {p.category for p in prompts} | {p.subtask for p in prompts}
        for c in categories:
            if c not in known:
                raise unknown("category", c, known)
        prompts = [p for p in prompts if p.category in categories or p.subtask in categories]
    if limit is None or limit >= len(prompts):
        return prompts
    groups: dict[str, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(p.subtask, []).append(p)
    chosen: list[Prompt] = []
    for i in range(max(len(g) for g in groups.values())):
        chosen.extend(g[i] for g in groups.values() if i < len(g))
    keep = {id(p) for p in chosen[:limit]}
    return [p for p in prompts if id(p) in keep]  # file order


def parse_shard(shard: str | None, env: dict[str, str]) -> tuple[int, int]:
    """`i/n` (0-based i), defaulting to SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT when set."""
    if shard is None:
        if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
            shard = f"{env['SLURM_ARRAY_TASK_ID']}/{env['SLURM_ARRAY_TASK_COUNT']}"
        else:
            return 0, 1
    try:
        i, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise UsageError(f"bad --shard '{shard}': expected i/n such as 0/4") from None
    if not 0 <= i < n:
        raise UsageError(f"bad --shard '{shard}': need 0 <= i < n")
    return i, n
