"""Is a divergence from the baseline a bug or rounding?

In bf16/fp16 a verify over many tokens and a one-token decode add up the same products in different orders,
so at a near-tie the argmax can flip and a lossless method leaves the baseline's text without any bug. To tell
the two apart we recompute, in float32 on the CPU, the target's logits at the first divergent position over
the baseline's own prefix. If the two tokens the runs chose are the float32 top-2 and their margin is below
the run dtype's threshold, the divergence is a *numeric tie*; otherwise it is a *mismatch* (a real bug).

Thresholds are in logit units, a few units in the last place of a typical top logit (|logit| in 8..32) in
the run's dtype: bf16 keeps 8 significant bits (ulp 0.0625-0.125 there), fp16 11 (0.008-0.016), fp32 24.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from specbench_cli.core.dtypes import dtype_name

TIE_THRESHOLD = {"bfloat16": 0.5, "float16": 0.0625, "float32": 1e-4}


@dataclass
class Divergence:
    kind: str  # "numeric tie" | "mismatch"
    margin: float  # float32 logit of the baseline's token minus the method's token
    threshold: float


def threshold(dtype: str) -> float:
    return TIE_THRESHOLD.get(dtype_name(dtype), TIE_THRESHOLD["float32"])


@torch.inference_mode()
def classify(model: torch.nn.Module, prefix: list[int], baseline_token: int, method_token: int, dtype: str) -> Divergence:
    """Classify the divergence after `prefix` (prompt + the baseline's output up to the divergent position).

    `model` should be the target in float32; its logits at the end of `prefix` decide."""
    param = next(model.parameters())
    logits = model(input_ids=torch.tensor([prefix], device=param.device)).logits[0, -1].float()
    top2 = set(logits.topk(2).indices.tolist())
    margin = float(logits[baseline_token] - logits[method_token])
    limit = threshold(dtype)
    tie = {baseline_token, method_token} <= top2 and abs(margin) < limit
    return Divergence("numeric tie" if tie else "mismatch", margin, limit)


def run_classifier(device: str = "cpu"):
    """A report classifier: loads each run's target once, in float32, and classifies divergences with it."""
    from specbench_cli.core.errors import UsageError
    from specbench_cli.loading import load_model
    from specbench_cli.models import MODELS, get_model_spec

    loaded: dict[tuple[str, str], torch.nn.Module | None] = {}

    def classify_run(info: dict, prefix: list[int], baseline_token: int, method_token: int) -> str:
        settings = info["settings"]
        name, target = settings["model"], settings.get("target")
        key = (name, target or "")
        if key not in loaded:
            registered = MODELS.get(name)
            try:
                spec = registered if registered is not None and registered.target == target else get_model_spec(name, target)
                loaded[key] = load_model(spec, torch.device(device), torch.float32).model
            except (UsageError, OSError, ValueError) as err:  # the target is not here: say so, classify nothing
                print(f"warning: divergences of {name} stay unclassified: {err}", file=sys.stderr)
                loaded[key] = None
        if loaded[key] is None:
            return "unclassified"
        return classify(loaded[key], prefix, baseline_token, method_token, settings.get("dtype", "float32")).kind

    return classify_run
