"""Is vLLM's grouped RMSNorm kernel per layer? Run in the engine's Python; prints one JSON line.

vLLM's DFlash drafter normalises every layer's context keys in one call, `ops.rms_norm(out, k[L, n, heads, d],
weight[L, d], eps)`, the weight selected per layer by the outermost index
(vllm/model_executor/models/qwen3_dflash.py, `_normalize_context_k`). On vLLM 0.32's CPU build the kernel uses
layer 0's weight for every layer: the cause `analysis.cross_engine.KNOWN_DIFFERENCES` names for DFlash steps
that differ from ours. Imports only torch and vLLM.
"""

import json

import torch
from vllm import _custom_ops as ops

torch.manual_seed(0)
keys = torch.randn(2, 5, 3, 64)
weight = torch.stack([torch.full((64,), 1.0), torch.full((64,), 2.0)])
out = torch.empty_like(keys)
ops.rms_norm(out, keys, weight, 1e-6)
per_layer = keys * torch.rsqrt(keys.pow(2).mean(-1, keepdim=True) + 1e-6) * weight[:, None, None, :]
print(json.dumps({"per_layer": [bool(torch.allclose(out[i], per_layer[i], atol=1e-5)) for i in range(2)],
                  "layer_1_used_layer_0_weight": bool(torch.allclose(out[1], per_layer[1] / 2, atol=1e-5))}))
