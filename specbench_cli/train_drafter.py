"""`specbench train-drafter`: train a drafter on a self-distillation corpus and write it in its loader's format.

EAGLE-3 objective (training-time test, as SpecForge trains it): step 0 feeds target features with the
next tokens and predicts the target's greedy token two ahead; step j feeds the draft's own step-(j-1)
outputs with tokens shifted by j and predicts j tokens further. Position t at step j attends to the
step-0 keys up to t (the real prefix, causal) and to its own keys of steps 1..j (the diagonal) — the
training-time image of a depth-j tree node seeing the prefix and its ancestors. Cross-entropy on the draft
vocabulary (the most frequent target tokens of the corpus); RoPE position t + j, as the node would have.

The loop: AdamW with linear warm-up, a held-out split scored per TTT position (top-1 accuracy), a
resumable state file, and a JSON card with data, steps, wall time, accuracies and the command.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from methods.checkpoints import save
from methods.eagle3 import Eagle3Config, Eagle3Draft, default_capture
from methods.layers import causal_mask
from specbench_cli.distill import Corpus
from specbench_cli.errors import UsageError

TRAINABLE = ("eagle3",)


@dataclass
class TrainSettings:
    method: str = "eagle3"
    steps: int = 2000
    lr: float = 1e-3
    warmup: int = 100
    ttt: int = 3  # training-time-test steps (EAGLE-3 trains with 7; scaled down for CPU)
    draft_vocab: int = 4096
    intermediate: int = 1024
    max_len: int = 384  # tokens per training sequence (longer ones are cut)
    holdout: float = 0.05
    eval_every: int = 200
    seed: int = 0


def new_eagle3(target: torch.nn.Module, corpus: Corpus, s: TrainSettings) -> Eagle3Draft:
    """An EAGLE-3 draft for this target; its vocabulary = the corpus' most frequent tokens (ascending)."""
    t = target.config
    L = t.num_hidden_layers
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    vocab = t.vocab_size
    draft_vocab = min(s.draft_vocab, vocab)
    c = Eagle3Config(hidden=t.hidden_size, target_hidden=t.hidden_size, heads=t.num_attention_heads,
                     kv_heads=t.num_key_value_heads, head_dim=head_dim, intermediate=s.intermediate,
                     eps=t.rms_norm_eps, rope_theta=float(getattr(t, "rope_theta", None) or 10000.0), rope_scaling=None,
                     draft_vocab=draft_vocab, vocab=vocab, capture=default_capture(L), norm_before_residual=False,
                     qk_norm=False, layer_prefix="midlayer.", own_embedding=False)
    missing = [l for l in c.capture if l not in corpus.layers]
    if missing:
        raise UsageError(f"corpus {corpus.folder} has no features for target layers {missing}")
    draft = Eagle3Draft(c, target.get_input_embeddings().weight.detach())
    draft.choose_vocab(corpus.sequences)
    return draft


def eagle3_loss(draft: Eagle3Draft, feats: torch.Tensor, ids: torch.Tensor, nxt: torch.Tensor, ttt: int,
                to_draft: torch.Tensor) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Mean cross-entropy over TTT steps, and (correct, counted) top-1 per step."""
    T = ids.shape[0] - 1  # positions t = 0..T-1 take feature t and token t+1
    h, past, extra = feats[:T], None, []
    losses, stats = [], []
    for j in range(ttt):
        n = T - j - 1  # positions whose label (the target's token at t+2+j) exists
        if n <= 0:
            break
        tokens = ids[1 + j: 1 + j + T]  # position t reads token t+1+j; the tail beyond the sequence is padding
        tokens = torch.nn.functional.pad(tokens, (0, T - tokens.shape[0]), value=int(ids[-1]))
        if j == 0:
            mask = causal_mask(T, 0, ids.device)
        else:
            eye = torch.eye(T, dtype=torch.bool, device=ids.device)
            mask = torch.cat([causal_mask(T, 0, ids.device)] + [eye] * j, dim=1)
        extra_kv = (torch.cat([k for k, _ in extra], 1), torch.cat([v for _, v in extra], 1)) if extra else None
        out, kv = draft.step(h, tokens, torch.arange(T, device=ids.device) + j, past, mask, extra_kv, features=j == 0)
        if j == 0:
            past = kv
        else:
            extra.append(kv)
        labels = to_draft[nxt[1 + j: 1 + j + n]]
        logits = draft.logits(out[:n])
        losses.append(torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100))
        valid = labels >= 0
        stats.append((int((logits.argmax(-1) == labels)[valid].sum()), int(valid.sum())))
        h = out
    return torch.stack(losses).mean(), stats


def train(target: torch.nn.Module, corpus: Corpus, out: Path, s: TrainSettings, command: str, progress=None,
          resume: bool = False) -> dict:
    if s.method not in TRAINABLE:
        raise UsageError(f"train-drafter --method {s.method} is not implemented yet (issue #5); trainable: {', '.join(TRAINABLE)}")
    torch.manual_seed(s.seed)
    target.requires_grad_(False)
    draft = new_eagle3(target, corpus, s)
    c = draft.config
    to_draft = draft.to_draft()
    order = list(range(len(corpus.sequences)))
    random.Random(s.seed).shuffle(order)
    n_hold = max(1, int(len(order) * s.holdout))
    held, train_ids = order[:n_hold], order[n_hold:]
    opt = torch.optim.AdamW(draft.parameters(), lr=s.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / max(1, s.warmup)))
    state_file, step, history, spent = out / "train_state.pt", 0, [], 0.0
    if resume and state_file.exists():
        state = torch.load(state_file, weights_only=False)
        draft.load_state_dict(state["draft"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step, history, spent = state["step"], state["history"], state["seconds"]
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def sample(i: int):
        seq = corpus.sequences[i][: s.max_len]
        return corpus.feats(i, c.capture)[: len(seq)], torch.tensor(seq), corpus.next(i)[: len(seq)]

    while step < s.steps:
        draft.train()
        feats, ids, nxt = sample(train_ids[step % len(train_ids)])
        loss, _ = eagle3_loss(draft, feats, ids, nxt, s.ttt, to_draft)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % s.eval_every == 0 or step == s.steps:
            acc = evaluate(draft, [sample(i) for i in held], s.ttt, to_draft)
            history.append({"step": step, "loss": float(loss.detach()), "heldout_top1": acc})
            torch.save({"draft": draft.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "step": step,
                        "history": history, "seconds": spent + time.perf_counter() - t0}, state_file)
        if progress is not None:
            progress(step, float(loss.detach()), history[-1]["heldout_top1"] if history else None)
    seconds = spent + time.perf_counter() - t0
    draft.eval()
    config, tensors = draft.export()
    save(out, config, {k: v.half() if v.is_floating_point() else v for k, v in tensors.items()})
    card = {"method": s.method, "settings": asdict(s), "command": command,
            "data": {"corpus": str(corpus.folder), "sequences": len(corpus.sequences), "tokens": corpus.tokens,
                     "train_sequences": len(train_ids), "heldout_sequences": len(held)},
            "steps": step, "wall_seconds": round(seconds, 1), "heldout_top1_per_position": history[-1]["heldout_top1"],
            "history": history, "dtype": "float16"}
    (out / "card.json").write_text(json.dumps(card, indent=2))
    return card


@torch.no_grad()
def evaluate(draft: Eagle3Draft, samples, ttt: int, to_draft: torch.Tensor) -> list[float]:
    draft.eval()
    correct, counted = [0] * ttt, [0] * ttt
    for feats, ids, nxt in samples:
        _, stats = eagle3_loss(draft, feats, ids, nxt, ttt, to_draft)
        for j, (a, b) in enumerate(stats):
            correct[j] += a
            counted[j] += b
    return [round(a / b, 4) if b else float("nan") for a, b in zip(correct, counted)]


def command_line() -> str:
    return " ".join(["specbench", *sys.argv[1:]])
