"""Everything about a method in one entry: its class, its training recipe, its calibrator, the components
`profile` measures on it and the target layers its drafter reads (the distillation corpus keeps their
features). Adding a method is one module (or folder) in methods/ and one line here.

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
    "baseline": MethodEntry("methods.baseline:Baseline", "autoregressive decoding on the same engine (one token per round)"),
    "hf-generate": MethodEntry("methods.hf_generate:HFGenerate", "transformers generate(), an outside reference"),
    "suffix": MethodEntry("methods.suffix:Suffix", "SuffixDecoding: frequency-scored drafts from suffix trees of prompt + earlier outputs"),
    "pld": MethodEntry("methods.pld:PromptLookup", "prompt lookup decoding: copy the continuation of the last n-gram's earlier match"),
    "eagle3": MethodEntry("methods.eagle3:Eagle3", "EAGLE-3: one draft layer over three target feature layers, top-k beam tree",
                          recipe=f"{RECIPES}.eagle3:Eagle3Recipe", reads_layers="methods.eagle3:default_capture"),
    "dflash": MethodEntry("methods.dflash:DFlash", "DFlash: block diffusion drafter, a block of mask tokens filled in one forward",
                          recipe=f"{RECIPES}.dflash:DFlashRecipe", reads_layers="methods.dflash:default_capture"),
    "dart": MethodEntry("methods.dart:Dart", "DART: one parallel draft forward with mask slots, n-gram guided tree search",
                        recipe=f"{RECIPES}.dart:DartRecipe", reads_layers="methods.eagle3:default_capture"),
    "confu": MethodEntry("methods.confu:ConFu", "ConFu: EAGLE-3 plus a future token from contemplate tokens in the target's verify pass",
                         recipe=f"{RECIPES}.confu:ConFuRecipe", reads_layers="methods.eagle3:default_capture"),
    "sps": MethodEntry("methods.sps:SpS", "speculative sampling with a small draft model (a chain of k tokens)",
                       recipe=f"{RECIPES}.sps:SpsRecipe"),
    "flashhead": MethodEntry("methods.flashhead:FlashHead", "SpS whose draft head is FlashHead (clustered head, top-p probes)",
                             profiles=("head",)),
    "whiflash-entropy": MethodEntry("methods.whiflash:WhiFlashEntropy", "WhiFlash: per-round eagle3/dflash routing by target entropy, lazy KV-only catch-up",
                                    calibrator=f"{CALIBRATION}.command:calibrate_entropy", profiles=("switching",)),
    "whiflash-neural": MethodEntry("methods.whiflash:WhiFlashNeural", "WhiFlash: per-round eagle3/dflash routing by a learned ΔAL predictor",
                                   calibrator=f"{CALIBRATION}.command:calibrate_neural", profiles=("switching",)),
    "hvd": MethodEntry("methods.hvd:Hvd", "Hybrid Verified Decoding: verify the suffix-cache draft when its predicted payoff is high, else eagle3",
                       calibrator=f"{CALIBRATION}.hvd:calibrate_hvd"),
    "hvd-freq": MethodEntry("methods.hvd:HvdFreq", "HVD's frequency baseline: the suffix-cache draft when its frequency score is high, else eagle3"),
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
