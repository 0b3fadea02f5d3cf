"""Self-distillation data for drafter training: the target answers training prompts, and its features are cached.

Prompts come from `datasets/train/` (GSM8K train questions, GPTeacher roleplay and code instructions, and the
summarisation, passage-grounded and translation prompts the project wrote; see its SOURCE.md) — never from an
evaluation set. The target answers each with its chat template, greedily,
in batches. Teacher-forced passes (several sequences each) then store, per token, the outputs of every target layer any drafter
reads (fp16, memory-mapped) and the target's greedy next token, so several drafters train from one pass.

Files in the corpus folder: `corpus.json` (token ids, prompt lengths, layers, settings), `features.npy`
[tokens, layers × H] float16, `next.npy` [tokens] int32; and, added by `cache_topk` the first time a KL
objective needs them, `topk_ids.npy` [tokens, k] int32 and `topk_probs.npy` [tokens, k] float16: the target's
k most likely next tokens at each position and their probabilities under its full softmax.
"""

from __future__ import annotations

import lzma
import json
import random
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from specbench_cli.datasets import DATASET_DIR, vendored_bytes
from specbench_cli.core.errors import UsageError

# file (JSONL, xz-compressed) -> (sha256 of its content, how a row becomes a prompt). The three upstream sources
# ship only the fields their prompts are made of (scripts/slim_training_prompts.py; datasets/train/SOURCE.md).
TRAIN_FILES = {
    "gsm8k_train.prompts.jsonl.xz": ("a892bf973e2148c3d3eeecc9a115348e1e337d92e398c705c81fae74f2990a59", "question"),
    "roleplay-simple-deduped-roleplay-instruct.prompts.jsonl.xz": (
        "0e14df4d2e4282e87340302c294c53b1ac67ae606f51c4d56a974a8e7bf48446", "instruction"),
    "codegen-instruct.prompts.jsonl.xz": ("5cca0bc30dc15d11acf32ab3e8d61eadc9b41a9243457b42a1d13ec732092e37", "instruction"),
    "written-tasks.jsonl.xz": ("3bae74467b0b787e142864b1dc84a4343aaa2bb03e984796550f5b3a2edac8c5", "prompt"),
}
# Sources added after corpora had been built from the others join the prompt order where those corpora end, so
# that such a corpus (the committed drafters' 2,000 prompts, and the answers shipped for them) stays the first
# prompts of the list and grows by extension instead of being rebuilt.
LATE_FILES = {"written-tasks.jsonl.xz"}
LATE_JOIN = 2000


CALIBRATION_SHARE = 1 / 16  # of each source, never trained on: the prompts routers and predictors calibrate on


def training_prompts(limit: int | None = None, seed: int = 0) -> list[str]:
    """Up to `limit` (default: all) distillation prompts, the sources interleaved so every one is represented
    until the smaller ones run out (the late ones from `LATE_JOIN` on); the calibration share of each source
    is never among them."""
    return _ordered({name: texts[:len(texts) - _held(texts)] for name, texts in _sources(seed).items()})[:limit]


def calibration_prompts(limit: int, seed: int = 0) -> list[str]:
    """Up to `limit` prompts no drafter trains on: each source's last `CALIBRATION_SHARE` after the shuffle
    (the last, so that corpora built before the share existed, from the first prompts, never touch it)."""
    return _ordered({name: texts[len(texts) - _held(texts):] for name, texts in _sources(seed).items()})[:limit]


def _ordered(sources: dict[str, list[str]]) -> list[str]:
    """The first sources round robin, and from position `LATE_JOIN` on the late ones with the rest of them
    (a list shorter than `LATE_JOIN`, like the calibration prompts, gets the late ones at its end)."""
    first = _interleave([texts for name, texts in sources.items() if name not in LATE_FILES])
    late = [texts for name, texts in sources.items() if name in LATE_FILES]
    return first[:LATE_JOIN] + _interleave([*late, first[LATE_JOIN:]])


def _held(texts: list[str]) -> int:
    return round(len(texts) * CALIBRATION_SHARE)


def _sources(seed: int) -> dict[str, list[str]]:
    """Each training file's prompts, checksummed, then shuffled with `seed`."""
    sources = {}
    for name, (sha, kind) in TRAIN_FILES.items():
        data = vendored_bytes(DATASET_DIR / "train" / name, sha, "training prompts")
        rows = [json.loads(line) for line in data.decode().splitlines()]
        texts = [row_prompt(r, kind) for r in rows]
        random.Random(seed).shuffle(texts)
        sources[name] = texts
    return sources


def row_prompt(row: dict, kind: str) -> str:
    """The prompt a training file's row gives (`kind`: how its TRAIN_FILES entry reads a row)."""
    if kind == "instruction":
        return row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
    return row[kind]


def shipped_corpus(model: str) -> Path:
    """Answers the target gave to its first training prompts, among them those its committed drafters trained
    on (a corpus.json, xz-compressed; see datasets/train/SOURCE.md), which a build takes instead of generating
    them again; it may not exist."""
    return DATASET_DIR / "train" / "distilled" / f"{model}.corpus.json.xz"


def _interleave(groups: list[list[str]]) -> list[str]:
    """Round robin over the groups, skipping each one once it is used up."""
    return [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]


@dataclass
class Corpus:
    """A corpus folder, memory-mapped (`load`), or a small corpus held in memory (`in_memory`, for tests)."""

    folder: Path | None  # None: held in memory
    sequences: list[list[int]]  # prompt + greedy response (cut after the first stop token)
    prompt_lens: list[int]
    layers: list[int]  # target decoder layers whose outputs `features` holds, in column order
    features: np.ndarray  # [tokens, len(layers) * H] float16 (memory-mapped)
    next_token: np.ndarray  # [tokens] the target's greedy token after each position
    offsets: np.ndarray  # [len(sequences) + 1] start of each sequence in the token arrays
    topk_held: tuple[np.ndarray, np.ndarray] | None = None  # an in-memory corpus' top-k arrays
    built_with: dict = field(default_factory=dict)  # the folder's build settings (max_new_tokens, seed)

    def feats(self, i: int, layers: list[int]) -> torch.Tensor:
        """Features of sequence i for the given layers (a subset of `self.layers`), as float32 [T, k*H]."""
        width = self.features.shape[1] // len(self.layers)
        rows = self.features[self.offsets[i]:self.offsets[i + 1]]
        cols = [rows[:, self.layers.index(l) * width:(self.layers.index(l) + 1) * width] for l in layers]
        return torch.from_numpy(np.concatenate(cols, axis=1).astype(np.float32))

    def next(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.next_token[self.offsets[i]:self.offsets[i + 1]].astype(np.int64))

    def topk(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's top-k next tokens [T, k] and their probabilities [T, k] for sequence i."""
        ids, probs = self._topk_arrays
        rows = slice(self.offsets[i], self.offsets[i + 1])
        return torch.from_numpy(ids[rows].astype(np.int64)), torch.from_numpy(probs[rows].astype(np.float32))

    @cached_property
    def _topk_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Memory-mapped once, on the first `topk` call (the files exist only after `cache_topk`)."""
        if self.topk_held is not None:
            return self.topk_held
        return tuple(np.load(self.folder / name, mmap_mode="r") for name in ("topk_ids.npy", "topk_probs.npy"))

    @property
    def has_topk(self) -> bool:
        return self.topk_held is not None or (self.folder is not None and (self.folder / "topk_probs.npy").exists())

    def first(self, n: int) -> Corpus:
        """The corpus' first n sequences (what a build of n prompts holds); the arrays stay whole."""
        if n >= len(self.sequences):
            return self
        return replace(self, sequences=self.sequences[:n], prompt_lens=self.prompt_lens[:n], offsets=self.offsets[:n + 1])

    @property
    def where(self) -> str:
        return "in memory" if self.folder is None else str(self.folder)

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1])

    @classmethod
    def load(cls, folder: Path) -> Corpus:
        meta = json.loads((folder / "corpus.json").read_text())
        return cls(folder, meta["sequences"], meta["prompt_lens"], meta["layers"],
                   np.load(folder / "features.npy", mmap_mode="r"), np.load(folder / "next.npy"),
                   _offsets(meta["sequences"]),
                   built_with={k: v for k, v in meta.items() if k not in ("sequences", "prompt_lens", "layers")})

    @classmethod
    @torch.inference_mode()
    def in_memory(cls, target: torch.nn.Module, sequences: list[list[int]], prompt_lens: list[int],
                  layers: list[int], topk: int = 0) -> Corpus:
        """The same records as a corpus folder, computed into memory (small corpora: tests' tiny drafters)."""
        rows = in_order(teacher_rows(target, sequences, layers))
        features = np.concatenate([f for f, _ in rows])
        held = None
        if topk:
            tops = in_order(topk_rows(target, sequences, topk))
            held = (np.concatenate([i for i, _ in tops]), np.concatenate([p for _, p in tops]))
        return cls(None, sequences, prompt_lens, layers, features, np.concatenate([n for _, n in rows]),
                   _offsets(sequences), held)


def _offsets(sequences: list[list[int]]) -> np.ndarray:
    return np.concatenate(([0], np.cumsum([len(s) for s in sequences]))).astype(np.int64)


TOKENS_PER_PASS = 2048  # padded tokens per teacher forward on a GPU (its fp32 logits: 2048 x vocab x 4 bytes)


def tokens_per_pass(device: torch.device) -> int:
    """A GPU runs a small target's pass in the time its kernels take to launch, so several sequences share
    one; a CPU is busy computing, and padding only adds work there (slower, measured on the embedded model),
    so each sequence goes alone."""
    return 1 if device.type == "cpu" else TOKENS_PER_PASS


def teacher_rows(target: torch.nn.Module, sequences: list[list[int]], layers: list[int]):
    """Per sequence i: (i, the given layers' outputs [T, len(layers) × H] fp16, the greedy next token of every
    position [T] int32), from teacher-forced passes over several sequences at once."""
    for group, out in _passes(target, sequences, hidden=True):
        features = torch.cat([out.hidden_states[l + 1] for l in layers], -1).half().cpu().numpy()
        nxt = out.logits.argmax(-1).cpu().numpy().astype(np.int32)
        for row, i in enumerate(group):
            yield i, (features[row, :len(sequences[i])], nxt[row, :len(sequences[i])])


def topk_rows(target: torch.nn.Module, sequences: list[list[int]], k: int):
    """Per sequence i: (i, the target's k most likely next tokens at every position [T, k] int32, their
    probabilities under its full softmax [T, k] fp16)."""
    for group, out in _passes(target, sequences, hidden=False):
        top = torch.softmax(out.logits.float(), -1).topk(k, dim=-1)
        ids, probs = top.indices.cpu().numpy().astype(np.int32), top.values.cpu().numpy().astype(np.float16)
        for row, i in enumerate(group):
            yield i, (ids[row, :len(sequences[i])], probs[row, :len(sequences[i])])


def in_order(rows) -> list:
    """The values of (i, value) pairs, by i."""
    return [value for _, value in sorted(rows, key=lambda row: row[0])]


@torch.inference_mode()
def _passes(target: torch.nn.Module, sequences: list[list[int]], hidden: bool):
    """(indices, output) of forwards over groups of sequences of similar length, right-padded: causal attention
    keeps the padding out of every real position, so each sequence gets what a pass of its own would give
    (up to float rounding), at a fraction of the calls."""
    device = next(target.parameters()).device
    for group in _length_groups(sequences, tokens_per_pass(device)):
        width = max(len(sequences[i]) for i in group)
        ids = torch.tensor([sequences[i] + [0] * (width - len(sequences[i])) for i in group], device=device)
        mask = None  # a sequence alone is passed as before grouping existed, without a mask
        if len(group) > 1:
            mask = torch.tensor([[1] * len(sequences[i]) + [0] * (width - len(sequences[i])) for i in group], device=device)
        yield group, target(input_ids=ids, attention_mask=mask, output_hidden_states=hidden)


def _length_groups(sequences: list[list[int]], tokens: int) -> list[list[int]]:
    """Indices grouped by length (longest first) so that a group's padded size stays within `tokens`
    (a longer sequence goes alone)."""
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
    groups: list[list[int]] = []
    for i in order:
        if groups and len(sequences[groups[-1][0]]) * (len(groups[-1]) + 1) <= tokens:
            groups[-1].append(i)  # the group's first sequence is its longest
        else:
            groups.append([i])
    return groups


ANSWERS = "answers.jsonl"  # a build's finished answer batches, so that a killed build resumes from them


@torch.inference_mode()
def generate(model, prompts: list[str], max_new_tokens: int, batch_size: int, progress=None,
             log: Path | None = None, known: dict[tuple[int, ...], list[int]] | None = None
             ) -> tuple[list[list[int]], list[int]]:
    """Greedy answers in left-padded batches; each sequence is prompt + answer up to its first stop token.

    `known` answers (chat-templated prompt ids -> sequence: those shipped with the drafters) are taken, not
    generated; the other prompts are answered in batches, in order. With `log`, every finished batch is
    appended to that file, and the answers it already holds (a killed build of the same prompts) are read
    back, not generated again; since whole batches are logged, the batches after them line up with those
    of an uninterrupted build."""
    encoded = _chat_ids(model, prompts)
    answers = {i: known[tuple(ids)] for i, ids in enumerate(encoded) if known and tuple(ids) in known}
    todo = [i for i in range(len(prompts)) if i not in answers]
    logged = _logged([encoded[i] for i in todo], max_new_tokens, log) if log else []
    answers.update(zip(todo, logged))
    if progress is not None and answers:
        progress(len(answers))
    pad = next(iter(sorted(model.stop_ids)), 0)
    for start in range(len(logged), len(todo), batch_size):
        rows = todo[start:start + batch_size]
        batch = [encoded[i] for i in rows]
        width = max(len(b) for b in batch)
        ids = torch.tensor([[pad] * (width - len(b)) + b for b in batch], device=model.device)
        mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch], device=model.device)
        out = model.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                   eos_token_id=sorted(model.stop_ids), pad_token_id=pad, temperature=None, top_p=None,
                                   top_k=None)
        for i, b, row in zip(rows, batch, out[:, width:].tolist()):
            answer = []
            for t in row:
                answer.append(t)
                if t in model.stop_ids:
                    break
            answers[i] = b + answer
        if log is not None:
            with log.open("a") as f:  # one write per batch: a kill leaves at most a cut last line
                f.write("".join(_answer_line(max_new_tokens, len(encoded[i]), answers[i]) + "\n" for i in rows))
        if progress is not None:
            progress(len(batch))
    return [answers[i] for i in range(len(prompts))], [len(ids) for ids in encoded]


def _answer_line(max_new_tokens: int, prompt_len: int, sequence: list[int]) -> str:
    return json.dumps({"max_new_tokens": max_new_tokens, "prompt_len": prompt_len, "sequence": sequence})


def shipped_answers(shipped: Path | None, max_new_tokens: int) -> dict[tuple[int, ...], list[int]]:
    """The answers a shipped corpus (`shipped_corpus`: an xz-compressed `corpus.json`) holds, by chat-templated prompt,
    when it was built with the same `max_new_tokens`; none otherwise. A build takes them instead of
    generating them, so the committed drafters' corpus is the same on every machine, even one whose float
    rounding would change a greedy answer."""
    if shipped is None or not shipped.exists():
        return {}
    meta = json.loads(lzma.decompress(shipped.read_bytes()))
    if meta["max_new_tokens"] != max_new_tokens:
        return {}
    return {tuple(seq[:n]): seq for n, seq in zip(meta["prompt_lens"], meta["sequences"])}


def _chat_ids(model, prompts: list[str]) -> list[list[int]]:
    """Each prompt as a user turn in the target's chat template."""
    return [model.encode_chat([{"role": "user", "content": p}]) for p in prompts]


def _logged(encoded: list[list[int]], max_new_tokens: int, log: Path) -> list[list[int]]:
    """The answers `log` holds (none if it is missing), checked against the prompts `encoded` (chat-templated
    ids); a cut last line is dropped."""
    if not log.exists():
        return []
    rows, lines = [], log.read_text().splitlines()
    for line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # the batch being written when the build was killed
    rows = rows[:len(encoded)]  # a killed build of more prompts serves a smaller one
    sequences, prompt_lens = [r["sequence"] for r in rows], [r["prompt_len"] for r in rows]
    if any(r["max_new_tokens"] != max_new_tokens for r in rows):
        raise UsageError(f"{log} holds answers of up to {rows[0]['max_new_tokens']} tokens; build with that "
                         "--max-new-tokens, or delete it")
    _check_prompts(sequences, prompt_lens, encoded, f"{log} holds answers to other prompts; delete it")
    if len(rows) < len(lines):  # without the cut line, so that the next batch starts on a line of its own
        log.write_text("".join(_answer_line(r["max_new_tokens"], r["prompt_len"], r["sequence"]) + "\n"
                               for r in rows))
    return sequences


def _check_prompts(sequences: list[list[int]], prompt_lens: list[int], encoded: list[list[int]], why: str) -> None:
    """Refuse, with `why`, sequences whose prompts are not the first of `encoded` (chat-templated prompt ids)."""
    if len(sequences) > len(encoded) or encoded[:len(sequences)] != [s[:n] for s, n in zip(sequences, prompt_lens)]:
        raise UsageError(why)


def build(model, prompts: list[str], folder: Path, layers: list[int], max_new_tokens: int, batch_size: int,
          seed: int = 0, progress=None, shipped: Path | None = None, teaching=None) -> Corpus:
    """Generate the answers (after those of a killed build, and those `shipped` holds), then cache features
    for them. `progress` counts answered prompts, `teaching` sequences through the teacher."""
    folder.mkdir(parents=True, exist_ok=True)
    sequences, prompt_lens = generate(model, prompts, max_new_tokens, batch_size, progress, folder / ANSWERS,
                                      shipped_answers(shipped, max_new_tokens))
    corpus = cache_features(model.model, sequences, prompt_lens, folder, layers,
                            {"max_new_tokens": max_new_tokens, "seed": seed}, progress=teaching)
    (folder / ANSWERS).unlink(missing_ok=True)  # corpus.json holds them now
    return corpus


def extend(model, corpus: Corpus, prompts: list[str], max_new_tokens: int, batch_size: int, seed: int = 0,
           progress=None, shipped: Path | None = None, teaching=None) -> Corpus:
    """Grow a corpus folder to `prompts` (the whole list, its first ones being the corpus' own): only the new
    prompts are answered and passed through the teacher; the old rows are copied first, unchanged, so a run
    on the smaller corpus still sees what it saw. The answers are those a build of all `prompts` would give
    when the corpus' generated answers (not the shipped ones) are a multiple of `batch_size` in number (the
    generation batches then line up)."""
    have, built = len(corpus.sequences), {"seed": 0, **corpus.built_with}  # corpora from before `seed`: 0
    if (built["max_new_tokens"], built["seed"]) != (max_new_tokens, seed):
        raise UsageError(f"{corpus.where} was built with --max-new-tokens {built['max_new_tokens']} --seed "
                         f"{built['seed']}; extend it with the same, or pass another --corpus")
    _check_prompts(corpus.sequences, corpus.prompt_lens, _chat_ids(model, prompts[:have]),
                   f"{corpus.where} holds other prompts than the first {have} training prompts (other training "
                   "files or --seed); pass another --corpus")
    sequences, prompt_lens = generate(model, prompts[have:], max_new_tokens, batch_size, progress,
                                      corpus.folder / ANSWERS, shipped_answers(shipped, max_new_tokens))
    grown = cache_features(model.model, corpus.sequences + sequences, corpus.prompt_lens + prompt_lens,
                           corpus.folder, corpus.layers, built, known=corpus, progress=teaching)
    (corpus.folder / ANSWERS).unlink(missing_ok=True)
    return grown


COPY_ROWS = 1 << 16  # feature rows copied at a time when a corpus grows (~75 MB of the embedded model's)


@torch.inference_mode()
def cache_features(target: torch.nn.Module, sequences: list[list[int]], prompt_lens: list[int], folder: Path,
                   layers: list[int], meta: dict | None = None, known: Corpus | None = None,
                   progress=None) -> Corpus:
    """Teacher-forced passes: layer outputs (fp16) and the greedy next token of every position, per sequence.
    `known`: this folder's corpus, whose sequences begin `sequences`; its rows are copied, not computed.
    `progress` is called with 1 for every sequence computed.

    The arrays are written beside the old ones and renamed over them, the top-k files (now too short) are
    dropped, and `corpus.json` goes last. Because old rows come first, a folder left between two renames
    still reads as the old corpus."""
    folder.mkdir(parents=True, exist_ok=True)
    total = sum(len(s) for s in sequences)
    width = target.config.hidden_size * len(layers)
    features = np.lib.format.open_memmap(folder / "features.tmp.npy", mode="w+", dtype=np.float16, shape=(total, width))
    nxt = np.zeros(total, dtype=np.int32)
    offsets = _offsets(sequences)
    done = 0 if known is None else len(known.sequences)
    for start in range(0, int(offsets[done]), COPY_ROWS):
        rows = slice(start, min(start + COPY_ROWS, int(offsets[done])))
        features[rows], nxt[rows] = known.features[rows], known.next_token[rows]
    for i, (f, n) in teacher_rows(target, sequences[done:], layers):
        rows = slice(offsets[done + i], offsets[done + i + 1])
        features[rows], nxt[rows] = f, n
        if progress is not None:
            progress(1)
    features.flush()
    del features
    np.save(folder / "next.tmp.npy", nxt)
    for name in ("topk_ids", "topk_probs"):  # `cache_topk` computes them again, for every row, when needed
        (folder / f"{name}.npy").unlink(missing_ok=True)
    for name in ("features", "next"):
        (folder / f"{name}.tmp.npy").replace(folder / f"{name}.npy")
    (folder / "corpus.tmp.json").write_text(json.dumps({"sequences": sequences, "prompt_lens": prompt_lens,
                                                        "layers": layers, **(meta or {})}))
    (folder / "corpus.tmp.json").replace(folder / "corpus.json")
    return Corpus.load(folder)


@torch.inference_mode()
def cache_topk(target: torch.nn.Module, corpus: Corpus, k: int = 16, progress=None) -> None:
    """Add the target's top-k next-token distribution per position (the KL targets) to a corpus folder."""
    ids = np.lib.format.open_memmap(corpus.folder / "topk_ids.tmp.npy", mode="w+", dtype=np.int32, shape=(corpus.tokens, k))
    probs = np.lib.format.open_memmap(corpus.folder / "topk_probs.tmp.npy", mode="w+", dtype=np.float16,
                                      shape=(corpus.tokens, k))
    for i, (top_ids, top_probs) in topk_rows(target, corpus.sequences, k):
        rows = slice(corpus.offsets[i], corpus.offsets[i + 1])
        ids[rows], probs[rows] = top_ids, top_probs
        if progress is not None:
            progress(1)
    for array in (ids, probs):
        array.flush()
    del ids, probs
    for name in ("topk_ids", "topk_probs"):  # renamed last, so an interrupted pass leaves no half file behind
        (corpus.folder / f"{name}.tmp.npy").rename(corpus.folder / f"{name}.npy")


def prepare(loaded, folder: Path, layers: list[int], prompts: int | None, max_new_tokens: int, batch_size: int,
            seed: int, needs_topk: bool, bar) -> Corpus:
    """The self-distillation corpus in `folder` with `prompts` sequences: built if missing, grown if it holds
    fewer (the target answers only the new prompts), its first `prompts` if it holds more; as it is when
    `prompts` is None. The target's top-k distributions are added when the recipe needs them."""
    shipped = shipped_corpus(loaded.spec.name)

    def counter(what: str, n: int):
        task = bar.add_task(what, total=n, stats="")
        return lambda k: bar.update(task, advance=k)

    if not (folder / "corpus.json").exists():
        texts = training_prompts(prompts, seed)
        new = len(texts)
        data = build(loaded, texts, folder, layers, max_new_tokens, batch_size, seed,
                     counter("answering training prompts", new), shipped, counter("teacher passes", new))
    else:
        data = Corpus.load(folder)
        if prompts is not None and prompts > len(data.sequences):
            texts = training_prompts(prompts, seed)
            new = len(texts) - len(data.sequences)
            if new > 0:  # there are only so many training prompts
                data = extend(loaded, data, texts, max_new_tokens, batch_size, seed,
                              counter("answering training prompts", new), shipped, counter("teacher passes", new))
    if needs_topk and not data.has_topk:  # for the whole folder, so that its files fit every later use
        cache_topk(loaded.model, data, progress=counter("target top-k distributions", len(data.sequences)))
    return data if prompts is None else data.first(prompts)
