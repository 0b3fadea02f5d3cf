"""EAGLE-3 (Li et al. 2025): one draft decoder layer over three target feature layers, drafting a tree.

Reference: SafeAILab/EAGLE `eagle/model/cnets.py` (`Model.forward`, `topK_genrate`). Checkpoints in two
layouts load here:
  flat (yuhuili, AngelSlim, Tengyunw, SpecForge): `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`;
  speculators (vLLM, RedHatAI/*-speculator.eagle3): `layers.0.*` and a nested `transformer_layer_config`,
  optional q_norm/k_norm (Qwen3 layer) and `norm_before_residual`.
The head dimension is read from the q_proj shape (AngelSlim/Qwen3-4B_eagle3 has 32 heads × 128 with
H = 2560, which the SafeAILab code cannot load), and the draft's RoPE from the draft config (no
rope_theta -> 10000, as in the Llama-3.1 checkpoint).

Which target layers feed the draft, as 0-based indices of decoder layers whose OUTPUT is read:
  default: outputs of layers (1, L/2-1, L-4) = HF hidden_states indices (2, L/2, L-3);
  speculators `eagle_aux_hidden_state_layer_ids` use vLLM's indexing (id j = output of layer j-1);
  SpecForge `eagle_config.eagle_aux_hidden_state_layer_ids` name layer outputs directly (sglang adds 1).

The code follows the data: `checkpoint.py` reads both layouts into an `Eagle3Config` (which target layers,
which vocabularies), `network.py` is the draft layer and its heads, `tree_search.py` is EAGLE's beam over the
draft's log-probs and the global top nodes kept, and `method.py` is the proposer the decode loop calls.
"""

from specbench_methods.eagle3.checkpoint import Eagle3Config, capture_layers, default_capture, read_config
from specbench_methods.eagle3.method import Eagle3
from specbench_methods.eagle3.network import Eagle3Draft, Eagle3Layer
from specbench_methods.eagle3.tree_search import Candidates, beam_search, top_nodes

__all__ = ["Candidates", "Eagle3", "Eagle3Config", "Eagle3Draft", "Eagle3Layer", "beam_search", "capture_layers",
           "default_capture", "read_config", "top_nodes"]
