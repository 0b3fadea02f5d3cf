"""Which vLLM speculative config runs each specbench method, written for vLLM 0.32.

Every key set here is a field of vLLM's `SpeculativeConfig` (vllm/config/speculative.py); the proposers are
vllm/v1/spec_decode/{ngram_proposer,suffix_decoding,eagle,dflash,draft_model}.py. vLLM drafts one chain per
step for every method (0.32 has no token tree), so a specbench option that would make a tree, or that has no
vLLM counterpart, is refused unless the user left it at a value vLLM's behaviour matches; an option left at
its default is set to what vLLM does and said in a note, so run.json records the options that actually ran.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

from specbench_cli.core.errors import UsageError

TESTED_VERSIONS = ("0.32",)  # vLLM minor versions this mapping was written and tested against


@dataclasses.dataclass
class EngineMethod:
    """A specbench run as vLLM runs it: its speculative config (None = no speculation), the method's options
    as they ran, and notes for the user."""

    speculative_config: dict | None
    options: object
    notes: list[str]
    known_differences: list[str] = dataclasses.field(default_factory=list)  # vLLM drafts otherwise than the method
    proposer: dict | None = None  # settings of specbench's own proposer inside vLLM (engines/vllm_routed.py)


def _keep(options, given: set[str], name: str, value, why: str, notes: list[str], within: str = ""):
    """Set option `name` to what vLLM does (`value`), refusing a different value the user asked for; `within`
    is the dotted prefix of a routed method's proposer options ("eagle3.")."""
    current = getattr(options, name)
    if current == value:
        return options
    if f"{within}{name}" in given:
        raise UsageError(f"--engine vllm cannot run {within}{name}={current}: {why}")
    notes.append(f"vLLM: {within}{name}={value} ({why})")
    return dataclasses.replace(options, **{name: value})


def _baseline(options, given, drafters, notes):
    return None, options


def _pld(options, given, drafters, notes):
    # ngram_proposer.py: the longest n-gram between prompt_lookup_max and prompt_lookup_min that matches
    return {"method": "ngram", "num_speculative_tokens": options.num_pred_tokens,
            "prompt_lookup_max": options.max_ngram, "prompt_lookup_min": options.min_ngram}, options


def _suffix_chain(options, given, notes, within: str = ""):
    # suffix_decoding.py hands ArcticInference's SuffixDecodingCache.speculate its max_spec_tokens,
    # max_spec_factor and min_token_prob, and verifies the draft's token_ids as one chain
    options = _keep(options, given, "tree", False, "vLLM verifies a suffix draft as one path", notes, within)
    return _keep(options, given, "max_spec_offset", 0.0, "vLLM's suffix config has no spec offset", notes, within)


def _suffix(options, given, drafters, notes):
    options = _suffix_chain(options, given, notes)
    return {"method": "suffix", "num_speculative_tokens": options.max_spec_tokens,
            "suffix_decoding_max_tree_depth": options.max_depth,
            "suffix_decoding_max_spec_factor": options.max_spec_factor,
            "suffix_decoding_min_token_prob": options.min_token_prob}, options


def _eagle3(options, given, drafters, notes, within: str = ""):
    # eagle.py drafts num_speculative_tokens tokens, one per draft step, always the top-1
    options = _keep(options, given, "top_k", 1, "vLLM's EAGLE-3 drafts a chain", notes, within)
    config = json.loads((Path(drafters["eagle3"]) / "config.json").read_text())
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if nested and not config.get("eagle_aux_hidden_state_layer_ids"):
        notes.append(f"warning: {drafters['eagle3']}/config.json names its feature layers only as eagle_config."
                     f"eagle_aux_hidden_state_layer_ids {nested} (layer outputs, SpecForge's meaning); vLLM reads them "
                     f"one layer early (vllm/v1/worker/gpu_model_runner.py). Add \"eagle_aux_hidden_state_layer_ids\": "
                     f"{[int(i) + 1 for i in nested]} at the top level to give vLLM the layers the draft was trained on")
    return {"method": "eagle3", "model": drafters["eagle3"], "num_speculative_tokens": _chain(options)}, options


def _chain(eagle3) -> int:
    return min(eagle3.depth + 1, eagle3.total_token - 1)  # the nodes our top_k=1 search keeps (tree_search.py)


SPECULATORS_DFLASH_CAUSAL = (
    "vLLM 0.32 reads a speculators DFlash config's sliding_window_non_causal=false as dflash_config.causal=true "
    "(vllm/transformers_utils/configs/speculators/algos.py, update_dflash), which makes every draft layer attend "
    "causally within the block (model_executor/models/qwen3_dflash.py, _dflash_layer_causal); speculators' own "
    "DFlashDraftModel, the paper and our engine attend bidirectionally in full-attention layers. Outputs stay "
    "lossless; acceptance may differ. With only full-attention layers, sliding_window_non_causal=true in the "
    "checkpoint's config.json gives vLLM the bidirectional block")


def _dflash(options, given, drafters, notes, within: str = ""):
    # dflash.py verifies 1 + num_speculative_tokens query positions: the block minus its anchor
    options = _keep(options, given, "sampling", "argmax", "vLLM's DFlash drafts the argmax", notes, within)
    config = json.loads((Path(drafters["dflash"]) / "config.json").read_text())
    if config.get("speculators_model_type") == "dflash" and not config.get("sliding_window_non_causal", False):
        notes.append(f"known difference: {SPECULATORS_DFLASH_CAUSAL}")
    return {"method": "dflash", "model": drafters["dflash"], "num_speculative_tokens": _block(options, drafters) - 1}, options


def _block(dflash, drafters: dict[str, str]) -> int:
    """DFlash's block: the option, else the checkpoint's."""
    return dflash.block_size or int(json.loads((Path(drafters["dflash"]) / "config.json").read_text())["block_size"])


def _sps(options, given, drafters, notes):
    # draft_model.py: a small causal LM drafting k tokens, verified together with the next step's root
    options = _keep(options, given, "deferred", True, "vLLM verifies the last draft token in the next step", notes)
    return {"method": "draft_model", "model": drafters["sps"], "num_speculative_tokens": options.k}, options


def _hybrid(options, given, drafters, notes):
    # engines/vllm_hvd.py: vLLM's EAGLE-3 proposer, subclassed to score the suffix-cache draft first; the
    # engine's speculation cap is the longer of the two drafts, and the proposer is called after bookkeeping
    suffix = _suffix_chain(options.suffix, given, notes, "suffix.")
    eagle3 = _eagle3(options.eagle3, given, drafters, notes, "eagle3.")
    options = _keep(options, given, "lazy_catchup", False, "vLLM's EAGLE-3 drafter runs over every step's verified "
                    "tokens, a cache step's included (its K = 0 path)", notes)
    options = dataclasses.replace(options, suffix=suffix, eagle3=eagle3[1])
    config = {**eagle3[0], "num_speculative_tokens": max(_chain(eagle3[1]), suffix.max_spec_tokens),
              "disable_padded_drafter_batch": True}
    return config, options


def _whiflash(options, given, drafters, notes):
    # engines/vllm_whiflash.py: vLLM's EAGLE-3 proposer owning vLLM's DFlash proposer; the engine's speculation cap
    # is the longer draft, and DFlash's queries reach one slot past its block (the scheduler's lookahead)
    eagle3 = _eagle3(options.eagle3, given, drafters, notes, "eagle3.")
    dflash = _dflash(options.dflash, given, drafters, notes, "dflash.")
    for name, why in (("lazy_catchup", "both vLLM drafters run over every step's verified tokens (their K = 0 path "
                                       "when not chosen)"),
                      ("kv_only", "vLLM's EAGLE-3 K = 0 path runs its whole layer over the step's tokens")):
        options = _keep(options, given, name, False, why, notes)
    options = dataclasses.replace(options, eagle3=eagle3[1], dflash=dflash[1])
    k = max(eagle3[0]["num_speculative_tokens"], dflash[0]["num_speculative_tokens"] + 1)
    return {**eagle3[0], "num_speculative_tokens": k, "disable_padded_drafter_batch": True}, options


MAPPINGS: dict[str, Callable] = {"baseline": _baseline, "pld": _pld, "suffix": _suffix, "eagle3": _eagle3,
                                 "dflash": _dflash, "sps": _sps, "hvd": _hybrid, "hvd-freq": _hybrid,
                                 "whiflash-entropy": _whiflash, "whiflash-neural": _whiflash}


def hybrid_settings(method: str, options, drafters: dict[str, str]) -> dict:
    """What the HVD proposer inside vLLM reads (engines/vllm_hvd.py): the payoff predictor (hvd; none for
    hvd-freq, which scores a draft by SuffixDecoding's own frequency score), the threshold as `specbench_methods.hvd`
    resolves it, EAGLE-3's chain length and the suffix cache's knobs."""
    predictor = drafters.get("hvd") if method == "hvd" else None
    threshold = options.threshold
    if math.isnan(threshold):
        threshold = (float(json.loads((Path(predictor) / "config.json").read_text()).get("threshold", 6.0))
                     if predictor else float(options.eagle3.depth))
    s = options.suffix
    return {"method": method, "predictor": predictor, "threshold": threshold,
            "eagle_k": _chain(options.eagle3),
            "suffix": {"max_depth": s.max_depth, "max_spec_tokens": s.max_spec_tokens,
                       "max_spec_factor": s.max_spec_factor, "min_token_prob": s.min_token_prob}}


def engine_method(method: str, options, given: set[str], drafters: dict[str, str]) -> EngineMethod:
    """The speculative config for `method` with its parsed `options` (`given`: the option names the user set)
    and its drafters' local folders; a method or option vLLM cannot run is refused in one line."""
    if method not in MAPPINGS:
        raise UsageError(f"--engine vllm runs {', '.join(MAPPINGS)}; not {method}")
    notes: list[str] = []
    config, options = MAPPINGS[method](options, given, drafters, notes)
    known = [n.removeprefix("known difference: ") for n in notes if n.startswith("known difference: ")]
    proposer = None
    if MAPPINGS[method] is _hybrid:
        proposer = hybrid_settings(method, options, drafters)
    elif MAPPINGS[method] is _whiflash:
        proposer = whiflash_settings(method, options, config, drafters)
    return EngineMethod(config, options, notes, known, proposer)


def whiflash_settings(method: str, options, config: dict, drafters: dict[str, str]) -> dict:
    """What the WhiFlash proposer inside vLLM reads (engines/vllm_whiflash.py): the DFlash drafter and block, the
    EAGLE-3 chain, and the policy with its thresholds as `specbench_methods.whiflash` resolves them (--opt threshold, else
    the calibration card's: per category for the entropy policy)."""
    card = {}
    if method in drafters:
        card = json.loads((Path(drafters[method]) / "config.json").read_text())
    threshold = options.threshold if not math.isnan(options.threshold) else float(card["threshold"])
    if method == "whiflash-neural":
        policy = {"kind": "neural", "router": drafters[method], "layer": card.get("layer"), "threshold": threshold}
    else:
        per = {} if not math.isnan(options.threshold) else card.get("thresholds", {})
        policy = {"kind": "entropy", "thresholds": per, "threshold": threshold}
    return {"method": method, "eagle_k": _chain(options.eagle3), "dflash": drafters["dflash"],
            "dflash_k": _block(options.dflash, drafters) - 1,
            "policy": policy}
