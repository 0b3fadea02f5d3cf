"""Is a divergence from the baseline a bug or rounding?

In bf16/fp16 a verify over many tokens and a one-token decode add up the same products in different orders,
so at a near-tie the argmax can flip and a lossless method leaves the baseline's text without any bug. To tell
the two apart we recompute, on the CPU in the run's dtype, the target's logits at the first divergent position
over the baseline's own prefix. If both tokens the runs chose are within the run dtype's threshold of the top
logit there, the divergence is a *numeric tie*; otherwise it is a *mismatch* (a real bug). Runs our engine
replayed (greedy_replay.py) are classified by their replays instead, which check every token.

Why the run's dtype and not float32 (what this recomputed in before): float32 is another computation, and a
bf16 run of a 30-layer model sits further from its logits than the threshold. On smollm2-135m in bf16 (4
Spec-Bench prompts x 128 tokens, plain target) a float32 recomputation called 5 of 8 divergences of eagle3, dflash
and suffix from the baseline mismatches, where a bf16 reference put every token those runs emitted within 0.19
logits of its own choice.

Thresholds are in logit units, a few units in the last place of a typical top logit (|logit| in 8..32) in
the run's dtype: bf16 keeps 8 significant bits (ulp 0.0625-0.125 there), fp16 11 (0.008-0.016), fp32 24.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from specbench_cli.core.dtypes import dtype_name, dtype_of

TIE_THRESHOLD = {"bfloat16": 0.5, "float16": 0.0625, "float32": 1e-4}


@dataclass
class Divergence:
    kind: str  # "numeric tie" | "mismatch"
    margin: float  # the reference logit of the baseline's token minus the method's token
    threshold: float


def threshold(dtype: str) -> float:
    return TIE_THRESHOLD.get(dtype_name(dtype), TIE_THRESHOLD["float32"])


@torch.inference_mode()
def classify(model: torch.nn.Module, prefix: list[int], baseline_token: int, method_token: int, dtype: str) -> Divergence:
    """Classify the divergence after `prefix` (prompt + the baseline's output up to the divergent position).

    `model` should be the target in the run's dtype; its logits at the end of `prefix` decide."""
    param = next(model.parameters())
    logits = model(input_ids=torch.tensor([prefix], device=param.device)).logits[0, -1].float()
    below = logits.max() - logits[[baseline_token, method_token]]  # each token's distance from the top logit
    limit = threshold(dtype)
    tie = bool((below < limit).all())
    return Divergence("numeric tie" if tie else "mismatch", float(logits[baseline_token] - logits[method_token]), limit)


def run_classifier(device: str = "cpu"):
    """A report classifier: loads each run's target once, in the run's dtype, and classifies divergences with it."""
    from specbench_cli.core.errors import UsageError
    from specbench_cli.loading import load_model
    from specbench_cli.models import MODELS, get_model_spec

    loaded: dict[tuple[str, str], torch.nn.Module | None] = {}

    def classify_run(info: dict, prefix: list[int], baseline_token: int, method_token: int) -> str:
        settings = info["settings"]
        name, target = settings["model"], settings.get("target")
        dtype = settings.get("dtype", "float32")
        key = (name, target or "", dtype)
        if key not in loaded:
            registered = MODELS.get(name)
            try:
                spec = registered if registered is not None and registered.target == target else get_model_spec(name, target)
                loaded[key] = load_model(spec, torch.device(device), dtype_of(dtype_name(dtype))).model
            except (UsageError, OSError, ValueError) as err:  # the target is not here: say so, classify nothing
                print(f"warning: divergences of {name} stay unclassified: {err}", file=sys.stderr)
                loaded[key] = None
        if loaded[key] is None:
            return "unclassified"
        return classify(loaded[key], prefix, baseline_token, method_token, dtype).kind

    return classify_run
