"""Load the vendored prompt sets (or a user's jsonl) into one normalised `Prompt` shape.

Every prompt has an id, its dataset, a `category` (the file's own label, e.g. `writing`), a `subtask`
(Spec-Bench's six groups: mt_bench, translation, summarization, qa, math_reasoning, rag; the dataset name
for AIME) and its user turns. Multi-turn prompts are decoded turn by turn by the runner.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import re
from dataclasses import dataclass
from pathlib import Path

from specbench_cli.core.errors import UsageError, unknown
from specbench_cli.hub_datasets import GROUPS, HUB, Member, load_hub
from specbench_cli.resources import resource_dir

DATASET_DIR = resource_dir("datasets")
# Vendored files ship xz-compressed (NAME.xz), so that a checkout copies quickly to a remote machine; a SOURCE.md's
# sha256 is of the content, which is the upstream file byte for byte unless the SOURCE.md says otherwise.
XZ_PRESET = 9 | lzma.PRESET_EXTREME
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
# The usual instruction for AIME in reasoning evaluations (Qwen2.5-Math evaluation's chat prompt).
AIME_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class DatasetFile:
    path: str  # relative to datasets/
    sha256: str  # of the vendored file, as its SOURCE.md gives it
    licence: str  # of the source repository, as its SOURCE.md says
    first_turn_only: bool = False  # a single-turn view of a multi-turn file (vLLM's MT-Bench regression test)


DATASETS: dict[str, DatasetFile] = {
    "spec-bench": DatasetFile("spec_bench/question.jsonl.xz", "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04",
                              "Apache-2.0"),
    "mt-bench": DatasetFile("mt_bench/question.jsonl.xz", "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
                            "Apache-2.0"),
    "mt-bench-1turn": DatasetFile("mt_bench/question.jsonl.xz", "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
                                  "Apache-2.0", first_turn_only=True),
    "aime24": DatasetFile("aime24/test.jsonl.xz", "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac",
                          "MIT (Qwen2.5-Math evaluation/; problems © MAA)"),
    "aime25": DatasetFile("aime25/test.jsonl.xz", "b4e273c02d3e7fe1b74b59eae768fc8230bfb0f79539890cb56f4361caac0331",
                          "Apache-2.0 (AReaL; problems © MAA)"),
}


@dataclass(frozen=True)
class Prompt:
    id: str
    dataset: str
    category: str
    subtask: str
    turns: tuple[str, ...]
    reference: str | None = None


def vendored_bytes(path: Path, sha256: str, what: str) -> bytes:
    """A vendored file's content (decompressed if it ships as `.xz`), checked against the sha256 its SOURCE.md
    gives."""
    data = path.read_bytes()
    data = lzma.decompress(data) if path.suffix == ".xz" else data
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise UsageError(f"{what} failed its checksum ({path}: sha256 {digest[:12]}…, expected {sha256[:12]}…)")
    return data


def write_vendored(path: Path, data: bytes) -> None:
    """Write a vendored file as it ships: xz-compressed when its name ends in .xz (fixed settings, so the same
    content gives the same bytes)."""
    path.write_bytes(lzma.compress(data, preset=XZ_PRESET) if path.suffix == ".xz" else data)


def load_dataset(name: str, base: Path = DATASET_DIR) -> list[Prompt]:
    """A registered name (checksum-verified) or a path to a `.jsonl` file."""
    data = None
    if name in DATASETS:
        entry = DATASETS[name]
        path = base / entry.path
        data = vendored_bytes(path, entry.sha256, f"dataset '{name}'")
    elif name in HUB or name in GROUPS:
        return load_suite(name)
    elif name.startswith(SPEED_BENCH):
        return load_speed_bench(name)
    elif name.endswith(".jsonl"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise UsageError(f"dataset file not found: {name}" + (" (it is a directory)" if path.is_dir() else ""))
    else:
        raise unknown("dataset", name, [*DATASETS, *HUB, *GROUPS])
    dataset = dataset_slug(name)
    rows = _read_jsonl(path, data)
    if name in DATASETS and DATASETS[name].first_turn_only:
        rows = [(n, {**row, "turns": row["turns"][:1]}) for n, row in rows]
    prompts = [_normalise(dataset, row, f"{path}:{n}", i) for i, (n, row) in enumerate(rows)]
    _check_unique(prompts, path)
    return prompts


def dataset_slug(name: str) -> str:
    """A dataset's name wherever it becomes part of a path or a label: the registered name, or a user file's
    stem with anything but letters, digits, '.', '_' and '-' replaced (`data/my set.jsonl` -> `my-set`)."""
    if name in DATASETS or name in HUB or name in GROUPS:
        return name
    if name.startswith(SPEED_BENCH):
        return f"speed-bench-{_speed_bench_file(name).parent.name}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(name).stem).strip("-.") or "dataset"


def _read_jsonl(path: Path, data: bytes | None = None) -> list[tuple[int, dict]]:
    """(line number, row) for every non-blank line of `path` (or of `data`, its content already read); each row
    must be a JSON object."""
    try:
        text = (path.read_bytes() if data is None else data).decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{path}: not UTF-8 text (byte {err.start}); save the file as UTF-8") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(f"{path}:{n}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise UsageError(f"{path}:{n}: each line must be a JSON object such as {{\"turns\": [\"...\"]}} (got {type(row).__name__})")
        rows.append((n, row))
    return rows


def _normalise(dataset: str, row: dict, where: str, index: int, subtask: str | None = None) -> Prompt:
    """Map the four vendored formats (and user files with the same fields) to a `Prompt`. `subtask` overrides
    the MT-Bench rule for readers whose groups are their own (a suite's datasets, SPEED-Bench's categories)."""
    if dataset.startswith("aime") and dataset in DATASETS:
        answer = row.get("answer")
        return Prompt(str(row["id"]), dataset, "math", dataset, (row["problem"] + AIME_SUFFIX,),
                      None if answer is None else str(int(str(answer))))
    turns = row["turns"] if "turns" in row else [row[k] for k in ("prompt", "question", "problem") if k in row][:1]
    if isinstance(turns, str):
        raise UsageError(f"{where}: 'turns' must be a list of strings; wrap a single turn in brackets: [\"...\"]")
    if not turns or not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        raise UsageError(f"{where}: needs 'turns' (a list of strings) or a 'prompt' string")
    if not all(t.strip() for t in turns):
        raise UsageError(f"{where}: turn {next(i for i, t in enumerate(turns) if not t.strip()) + 1} is empty")
    category = str(row.get("category", "custom"))
    if subtask is None:
        subtask = "mt_bench" if category in MT_BENCH_CATEGORIES and len(turns) > 1 else category
    ref = row.get("reference")
    reference = json.dumps(ref) if isinstance(ref, list) else ref
    pid = row.get("question_id", row.get("id", index))
    return Prompt(str(pid), dataset, category, subtask, tuple(turns), reference)


def load_suite(name: str, files: dict[str, list[Path]] | None = None) -> list[Prompt]:
    """A hub dataset, or a paper's suite of them (ids prefixed with their dataset, which is also each prompt's
    subtask; the category is the paper's). `files`: local files in each dataset's hub schema (tests)."""
    members = GROUPS.get(name, (Member(name),))
    prompts = []
    for member in members:
        for row_id, category, turns in load_hub(member, (files or {}).get(member.name)):
            pid = row_id if len(members) == 1 else f"{member.name}/{row_id}"
            prompts.append(_normalise(name, {"id": pid, "category": category, "turns": turns},
                                      f"{member.name} row {row_id}", len(prompts), subtask=member.name))
    _check_unique(prompts, Path(name))
    return prompts


SPEED_BENCH = "speed-bench:"  # --dataset speed-bench:PATH, a folder prepared by SPEED-Bench's own prepare_data.py
# The text SPEED-Bench's public rows hold instead of each prompt (NVIDIA/Model-Optimizer specdec_bench
# datasets/speed.py, TURNS_PLACEHOLDER): the real prompts are assembled from their sources by prepare_data.py.
SPEED_PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"
SPEED_PREPARE = ("prepare it with NVIDIA/Model-Optimizer's examples/specdec_bench/prepare_data.py --config qualitative "
                 "(it writes data/speed/<config>/test.parquet) and pass speed-bench:data/speed/qualitative")


def load_speed_bench(name: str) -> list[Prompt]:
    """SPEED-Bench (NVIDIA 2026) as prepared by its own tool: test.parquet with question_id, category,
    sub_category, turns, source, src_id, difficulty, multiturn. Each category (the qualitative split's 11
    domains, the throughput splits' entropy tiers) is both category and subtask; multi-turn prompts are
    decoded turn by turn like MT-Bench, each turn seeing the model's own earlier answers."""
    import pyarrow.parquet as pq

    path = _speed_bench_file(name)
    try:
        rows = pq.read_table(path, columns=["question_id", "category", "turns"]).to_pylist()
    except Exception as err:  # pyarrow's errors share no base class worth naming
        raise UsageError(f"{path}: not a prepared SPEED-Bench parquet file ({str(err).splitlines()[0]})") from None
    dataset = dataset_slug(name)
    prompts = []
    for i, row in enumerate(rows):
        turns = row["turns"] or []
        if any(isinstance(t, str) and t.startswith(SPEED_PLACEHOLDER) for t in turns):
            raise UsageError(f"{path} holds SPEED-Bench's placeholders, not its prompts: {SPEED_PREPARE}")
        prompts.append(_normalise(dataset, {"id": row["question_id"], "category": row["category"], "turns": turns},
                                  f"{path} row {i + 1}", i, subtask=str(row["category"])))
    _check_unique(prompts, path)
    return prompts


def _speed_bench_file(name: str) -> Path:
    """speed-bench:PATH names a config folder (holding test.parquet), a test.parquet file, or the prepared root
    (holding <config>/test.parquet), whose `qualitative` config is then taken."""
    path = Path(name[len(SPEED_BENCH):]).expanduser()
    for candidate in (path, path / "test.parquet", path / "qualitative" / "test.parquet"):
        if candidate.is_file():
            return candidate
    raise UsageError(f"SPEED-Bench data not found at {path}: {SPEED_PREPARE}")


def _check_unique(prompts: list[Prompt], path: Path) -> None:
    """Records are keyed by prompt id: two rows with one id would overwrite each other in a report."""
    seen: dict[str, int] = {}
    for i, p in enumerate(prompts):
        if p.id in seen:
            raise UsageError(f"{path}: id '{p.id}' appears twice (prompts {seen[p.id] + 1} and {i + 1}; a row without "
                             f"'id' or 'question_id' is named by its position from 0); ids must be unique")
        seen[p.id] = i


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


# Warm-up decodes a prompt outside the scored selection (compilation, allocator and cache warm-up never enter a
# score). When the selection is the whole dataset there is none, and this neutral prompt is used instead,
# rather than scoring a prompt whose answer the method (a suffix cache) has already seen.
BUILTIN_WARMUP = Prompt("builtin-warmup", "builtin", "warmup", "warmup",
                        ("Write a short paragraph about the history of the bicycle.",))


def warmup_prompts(everything: list[Prompt], scored: list[Prompt], n: int) -> list[Prompt]:
    """The first `n` prompts of the dataset that are not scored; the built-in prompt where none is left."""
    scored_ids = {p.id for p in scored}
    spare = [p for p in everything if p.id not in scored_ids]
    return (spare or [BUILTIN_WARMUP])[:n]


def dataset_rows() -> list[tuple[str, ...]]:
    """Every dataset --dataset accepts, for `run --list`: vendored files, hub datasets, the papers' suites, the open
    formats."""
    from specbench_cli.hub_datasets import OURS, cached

    rows = []
    for name, entry in DATASETS.items():
        prompts = load_dataset(name)
        rows.append((name, f"datasets/{entry.path}" + (" (first turns)" if entry.first_turn_only else ""),
                     "vendored, sha256 checked", str(len(prompts)), " ".join(sorted({p.category for p in prompts})),
                     entry.licence, "yes"))
    for name, e in HUB.items():
        files = f" (files: {e.files[0]}" + (f" and {len(e.files) - 1} more)" if len(e.files) > 1 else ")") if e.files else ""
        source = " ".join(x for x in (e.hub_id, e.config, e.split) if x) + files + (
            "; prompts built our way" if e.source == OURS else "")
        rows.append((name, source, e.revision[:12] if e.revision else "main, not pinned yet", str(e.size), e.category,
                     e.licence, "cached" if cached(e) else "downloads on first use"))
    for name, members in GROUPS.items():
        sizes = {m.size for m in members}
        each = f" ({sizes.pop()} of each)" if len(sizes) == 1 and None not in sizes else ""
        rows.append((name, "suite: " + " ".join(m.name for m in members) + each,
                     "as its members", str(sum(m.size or m.entry.size for m in members)),
                     " ".join(dict.fromkeys(m.category or m.entry.category for m in members)), "as its members", "—"))
    rows += [("speed-bench:PATH", "SPEED-Bench, prepared by its prepare_data.py (docs/datasets.md)", "—", "880 (qualitative)",
              "its 11 categories", "per source", "—"),
             ("FILE.jsonl", "your own prompts: turns or prompt per line", "—", "—", "category field", "yours", "—")]
    return rows
