"""Everything about a method in one entry: its class, its training recipe, its calibrator, the components
`profile` measures on it and the target layers its drafter reads (the distillation corpus keeps their
features). Adding a method is one module (or folder) in methods/ and one line here. Everything about an engine
(`run --engine`) the same way: its job, its checks, its plan hook, how `tune` measures on it, the load it takes.

Entries name their code as "module:attribute" and are imported only when used (the lm-evaluation-harness
way), so naming a method costs nothing, an unknown one is answered at once with "did you mean", and a heavy
method costs nothing to the others. The registry sits above methods/ and the commands' packages it points
into; methods/ itself knows no registry.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from specbench_cli.core.errors import UsageError, unknown


@dataclass(frozen=True)
class MethodEntry:
    code: str  # the Method subclass, "module:Class"
    about: str  # one line for run --list
    recipe: str | None = None  # train-drafter's recipe for its drafter, "module:Class"
    calibrator: str | None = None  # calibrate's function (config, console) -> result, "module:function"
    reads_layers: str | None = None  # function(target layers) -> the layers whose features its drafter reads
    profiles: tuple[str, ...] = ()  # profile --component/--switching measurements it supports


RECIPES = "specbench_cli.commands.train.recipes"
CALIBRATION = "specbench_cli.commands.calibrate"
METHODS: dict[str, MethodEntry] = {
    "baseline": MethodEntry("specbench_methods.baseline:Baseline", "autoregressive decoding on the same engine (one token per round)"),
    "hf-generate": MethodEntry("specbench_methods.hf_generate:HFGenerate", "transformers generate(), an outside reference"),
    "suffix": MethodEntry("specbench_methods.suffix:Suffix", "SuffixDecoding: frequency-scored drafts from suffix trees of prompt + earlier outputs"),
    "pld": MethodEntry("specbench_methods.pld:PromptLookup", "prompt lookup decoding: copy the continuation of the last n-gram's earlier match"),
    "eagle3": MethodEntry("specbench_methods.eagle3:Eagle3", "EAGLE-3: one draft layer over three target feature layers, top-k beam tree",
                          recipe=f"{RECIPES}.eagle3:Eagle3Recipe", reads_layers="specbench_methods.eagle3:default_capture"),
    "dflash": MethodEntry("specbench_methods.dflash:DFlash", "DFlash: block diffusion drafter, a block of mask tokens filled in one forward",
                          recipe=f"{RECIPES}.dflash:DFlashRecipe", reads_layers="specbench_methods.dflash:default_capture"),
    "dart": MethodEntry("specbench_methods.dart:Dart", "DART: one parallel draft forward with mask slots, n-gram guided tree search",
                        recipe=f"{RECIPES}.dart:DartRecipe", reads_layers="specbench_methods.eagle3:default_capture"),
    "confu": MethodEntry("specbench_methods.confu:ConFu", "ConFu: EAGLE-3 plus a future token from contemplate tokens in the target's verify pass",
                         recipe=f"{RECIPES}.confu:ConFuRecipe", reads_layers="specbench_methods.eagle3:default_capture"),
    "sps": MethodEntry("specbench_methods.sps:SpS", "speculative sampling with a small draft model (a chain of k tokens)",
                       recipe=f"{RECIPES}.sps:SpsRecipe"),
    "flashhead": MethodEntry("specbench_methods.flashhead:FlashHead", "SpS whose draft head is FlashHead (clustered head, top-p probes)",
                             profiles=("head",)),
    "whiflash-entropy": MethodEntry("specbench_methods.whiflash:WhiFlashEntropy", "WhiFlash: per-round eagle3/dflash routing by target entropy, lazy KV-only catch-up",
                                    calibrator=f"{CALIBRATION}.command:calibrate_entropy", profiles=("switching",)),
    "whiflash-neural": MethodEntry("specbench_methods.whiflash:WhiFlashNeural", "WhiFlash: per-round eagle3/dflash routing by a learned ΔAL predictor",
                                   calibrator=f"{CALIBRATION}.command:calibrate_neural", profiles=("switching",)),
    "hvd": MethodEntry("specbench_methods.hvd:Hvd", "Hybrid Verified Decoding: verify the suffix-cache draft when its predicted payoff is high, else eagle3",
                       calibrator=f"{CALIBRATION}.hvd:calibrate_hvd"),
    "hvd-freq": MethodEntry("specbench_methods.hvd:HvdFreq", "HVD's frequency baseline: the suffix-cache draft when its frequency score is high, else eagle3"),
}


def load(ref: str):
    """The attribute a "module:attribute" reference names, its module imported now."""
    module, attribute = ref.split(":")
    return getattr(importlib.import_module(module), attribute)


def entry(name: str) -> MethodEntry:
    if name not in METHODS:
        raise unknown("method", name, METHODS)
    return METHODS[name]


def method_class(name: str):
    return load(entry(name).code)


def recipe_class(name: str):
    """train-drafter's recipe for the method's drafter; a method without one is named with those that have one."""
    ref = entry(name).recipe
    if ref is None:
        trainable = [n for n, e in METHODS.items() if e.recipe]
        raise UsageError(f"train-drafter --method {name}: no training recipe for it; trainable: {', '.join(trainable)}")
    return load(ref)


def calibrator(name: str):
    ref = entry(name).calibrator
    if ref is None:
        raise UsageError(f"calibrate knows {', '.join(n for n, e in METHODS.items() if e.calibrator)} (got '{name}')")
    return load(ref)


def corpus_layers(target_layers: int) -> list[int]:
    """The target layers whose features the distillation corpus keeps: every trainable drafter's, so one
    corpus serves them all."""
    refs = {e.reads_layers for e in METHODS.values() if e.recipe and e.reads_layers}
    return sorted({layer for ref in refs for layer in load(ref)(target_layers)})


def supports(name: str, profile: str) -> list[str]:
    """The methods whose entries list this profile measurement (for the message when `name` has none)."""
    return [] if profile in entry(name).profiles else [n for n, e in METHODS.items() if profile in e.profiles]


@dataclass(frozen=True)
class EngineEntry:
    """An engine behind `run --engine`: where its code is, and what a command must know of it without an `if`."""

    job: str  # "module:callable" (plan, console, model or None) -> the run_folder.PromptJob that runs a checked plan
    check: str  # "module:function" (config, env) -> its EnginePlan or None: its own input checks (no torch)
    tune: str  # the module that tunes a budget on it: `check(config, levels)`, `tune(settings, levels, console)`
    about: str
    load: str  # the load setting it takes (inputs.LOADS): our engine batches, a serving engine keeps requests in flight
    load_about: str  # said when the other load is given
    plan: str | None = None  # "module:function" (Plan) -> Plan: what the engine adds to a checked plan
    tag: str = ""  # names its folders and tuned budgets ("" for our engine, whose names predate engines)
    our_target: bool = False  # it decodes on our TargetModel (batch invariance, prepacked weights, --compile apply)
    draft_table: bool = False  # it takes a draft length per batch size (`tune`'s schedule) and picks one each step

    def make_job(self, plan, console, model=None):
        return load(self.job)(plan, console, model)

    def tuner(self):
        """The module that tunes a budget on this engine (`commands/tune/`)."""
        return importlib.import_module(self.tune)


ENGINES: dict[str, EngineEntry] = {
    "specbench": EngineEntry("specbench_cli.engines.specbench:RunJob", "specbench_cli.engines.options:ours",
                             "specbench_cli.commands.tune.batch", "our decode loop (core/engine.py)", "batch_size",
                             "our engine decodes --batch-size sequences together", our_target=True),
    "vllm": EngineEntry("specbench_cli.engines.vllm:VllmJob", "specbench_cli.engines.options:vllm",
                        "specbench_cli.commands.tune.vllm", "a vLLM engine in its own Python, or a vLLM server",
                        "concurrency", "it batches the requests it has in flight: use --concurrency",
                        plan="specbench_cli.engines.vllm:plan_engine", tag="vllm", draft_table=True),
}


def engine_entry(name: str) -> EngineEntry:
    if name not in ENGINES:
        raise unknown("engine", name, ENGINES)
    return ENGINES[name]


def plan_for_engine(plan):
    """The checked plan with what its engine adds (the vLLM speculative config, its Python), before anything
    starts."""
    entry = engine_entry(plan.config.engine)
    return plan if entry.plan is None else load(entry.plan)(plan)
