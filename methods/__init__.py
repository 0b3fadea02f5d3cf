"""The method registry: a name on the command line -> the module and class that implement it.

Modules are imported only when their method is chosen, so a heavy method costs nothing to the others.
A new method adds a module here and one line below; the decode loop does not change.
"""

from __future__ import annotations

import importlib

from specbench_cli.core.errors import unknown

METHODS: dict[str, tuple[str, str, str]] = {
    # name: (module, class, one-line description)
    "baseline": ("methods.baseline", "Baseline", "autoregressive decoding on the same engine (one token per round)"),
    "hf-generate": ("methods.hf_generate", "HFGenerate", "transformers generate(), an outside reference"),
    "suffix": ("methods.suffix", "Suffix", "SuffixDecoding: frequency-scored drafts from suffix trees of prompt + earlier outputs"),
    "pld": ("methods.pld", "PromptLookup", "prompt lookup decoding: copy the continuation of the last n-gram's earlier match"),
    "eagle3": ("methods.eagle3", "Eagle3", "EAGLE-3: one draft layer over three target feature layers, top-k beam tree"),
    "dflash": ("methods.dflash", "DFlash", "DFlash: block diffusion drafter, a block of mask tokens filled in one forward"),
    "dart": ("methods.dart", "Dart", "DART: one parallel draft forward with mask slots, n-gram guided tree search"),
    "confu": ("methods.confu", "ConFu", "ConFu: EAGLE-3 plus a future token from contemplate tokens in the target's verify pass"),
    "sps": ("methods.sps", "SpS", "speculative sampling with a small draft model (a chain of k tokens)"),
    "flashhead": ("methods.flashhead", "FlashHead", "SpS whose draft head is FlashHead (clustered head, top-p probes)"),
    "whiflash-entropy": ("methods.whiflash", "WhiFlashEntropy", "WhiFlash: per-round eagle3/dflash routing by target entropy, lazy KV-only catch-up"),
    "whiflash-neural": ("methods.whiflash", "WhiFlashNeural", "WhiFlash: per-round eagle3/dflash routing by a learned ΔAL predictor"),
    "hvd": ("methods.hvd", "Hvd", "Hybrid Verified Decoding: verify the suffix-cache draft when its predicted payoff is high, else eagle3"),
    "hvd-freq": ("methods.hvd", "HvdFreq", "HVD's frequency baseline: the suffix-cache draft when its frequency score is high, else eagle3"),
}


def method_class(name: str):
    if name not in METHODS:
        raise unknown("method", name, METHODS)
    module, cls, _ = METHODS[name]
    return getattr(importlib.import_module(module), cls)
