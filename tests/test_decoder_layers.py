"""Every decoder layer of an eager bf16 CPU forward in one C++ call (`core.decoder_layers`): where it runs, that it
computes what the layers as PyTorch operators compute (within rounding: its sums and exp round in their own
order), captured layers included, and that a batch's rows, padded and packed, are each sequence's own bit for bit.
That a verify row equals the one-token decode at its position with it (chains and trees) is
tests/test_batch_invariant.py's, which runs it wherever the row kernel is built."""

from __future__ import annotations

import random

import pytest
import torch

from specbench_cli.core.kernels import can_pack
from specbench_cli.core.row_attention import kernel
from specbench_cli.core.target import Target, TargetModel
from specbench_cli.core.tree import DraftTree
from tests.conftest import tiny_model
from tests.helpers import random_prompt
from tests.test_verify import random_tree

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(kernel() is None, reason="the C++ kernels do not build here")


def tiny(arch: str, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    if arch != "qwen2":
        return tiny_model(arch).to(dtype)
    from transformers import Qwen2Config, Qwen2ForCausalLM  # biases on q, k and v

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # random biases (the checkpoint's are trained; zeros would test nothing)
        for layer in model.model.layers:
            for name in ("q_proj", "k_proj", "v_proj"):
                getattr(layer.self_attn, name).bias.normal_(0, 0.5)
    return model.to(dtype)


def test_runs_where_the_row_kernel_attends_and_can_be_turned_off(monkeypatch):
    """bf16 takes the one-call layers where this build packs bf16 GEMMs (oneDNN on an avx512_bf16 CPU), else
    PyTorch's layers; a plain float32 target takes the one call unless SPECBENCH_FP32_KERNELS=0 (then it runs the
    reference path), and the switch turned off always takes PyTorch's."""
    model = tiny("llama")
    fused = "one call" if can_pack(CPU, torch.bfloat16) else "pytorch"
    assert Target(model, CPU).shared.layers == fused
    assert Target(model, CPU, invariant=True).shared.layers == fused
    assert Target(tiny_model("llama"), CPU).shared.layers == "one call"  # float32 (core.kernels.float32_kernels)
    monkeypatch.setenv("SPECBENCH_FP32_KERNELS", "0")
    assert Target(tiny_model("llama"), CPU).shared.layers == "pytorch"  # float32: the reference path
    monkeypatch.delenv("SPECBENCH_FP32_KERNELS")
    monkeypatch.setenv("SPECBENCH_DECODER_LAYERS", "0")
    assert Target(model, CPU).shared.layers == "pytorch"


def forwards(model: torch.nn.Module, invariant: bool) -> list[torch.Tensor]:
    """Logits and layer 0's captured output of a prefill, three decodes, a chain of 8 and a 12-node tree."""
    target = Target(model, CPU, invariant=invariant)
    target.capture([0])
    prompt = random_prompt(40, vocab=96, seed=1)
    out = [target.prefill(prompt[:-1])[None]]
    root = prompt[-1]
    for _ in range(3):
        out += [target.verify(root, DraftTree.chain([]))]
        target.commit([0])
        root = int(out[-1][0].argmax())
    out += [target.verify(root, DraftTree.chain(random_prompt(7, vocab=96, seed=2))), target.captured[0]]
    target.commit([0])
    out += [target.verify(root, random_tree(random.Random(3), 12, 96)), target.captured[0]]
    return [x.float() for x in out]


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen2"])
@pytest.mark.parametrize("invariant", [False, True])
@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 2e-2), (torch.float32, 1e-4)])
def test_computes_what_the_pytorch_layers_compute(arch, invariant, dtype, tol, monkeypatch):
    """bf16 where this build packs it; float32, where the op runs for a plain target on every CPU (the only way
    CI's CPU, without bf16 instructions, runs it)."""
    model = tiny(arch, dtype)
    if dtype == torch.float32 and not invariant:  # else the comparison below would be of PyTorch's layers twice
        assert Target(model, CPU).shared.layers == "one call"
    fused = forwards(model, invariant)
    monkeypatch.setenv("SPECBENCH_DECODER_LAYERS", "0")
    reference = forwards(model, invariant)
    for got, want in zip(fused, reference):
        assert got.shape == want.shape
        assert torch.allclose(got, want, rtol=tol, atol=tol), (got - want).abs().max()
        # the same greedy choices (no near-ties in these logits)
        assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_batch_gives_each_sequence_its_own_rows(arch):
    """Three sequences of different lengths verifying trees of different sizes in one forward (rows padded to the
    largest, the row-wise parts on real rows only) get, bit for bit, what each gets alone (batch-invariant)."""
    model = tiny(arch)
    prompts = [random_prompt(n, vocab=96, seed=n) for n in (20, 33, 47)]
    trees = [random_tree(random.Random(n), n, 96) for n in (3, 10, 6)]
    batch = TargetModel(model, CPU, invariant=True, slots=3)
    for t, prompt in zip(batch.slots, prompts):
        t.prefill(prompt[:-1])
    together = batch.verify([(t, p[-1], tree, None) for t, p, tree in zip(batch.slots, prompts, trees)])
    for prompt, tree, logits in zip(prompts, trees, together):
        alone = Target(model, CPU, invariant=True)
        alone.prefill(prompt[:-1])
        assert torch.equal(alone.verify(prompt[-1], tree), logits)
