"""The greedy replay: after each prompt, untimed, every emitted token checked against the target's own choice.

Why: the default times the target as a serving engine runs it (a verify's rows in one GEMM, attention over
the rows together), and in bf16 a row's rounding there follows the row count, so at a near-tie a correct
method's token can differ from the one a one-token decode would pick. Computing every row exactly as a decode
does (the batch-invariant target, `--batch-invariant on`) makes outputs equal bit for bit, but makes a verify
on a CPU costlier (docs/losslessness.md) — a cost no serving engine pays, which would then sit inside every
speed figure. So losslessness is checked apart from the timing: each temperature-0 turn's tokens are fed
to a reference target after the prompt is recorded — its prompt prefilled, its output verified as chains
— and at every position the reference's greedy choice given the turn's own earlier tokens is compared with
the token the run emitted. A token that differs is a *numeric tie* when its reference logit is within the
dtype's threshold of the top one (`analysis.divergence.TIE_THRESHOLD`: a few units in the last place), else a
*mismatch*: a bug. The reference runs in the run's dtype: a float32 model is another computation, whose logits
sit further than that from a bf16 run's (report's float32 classifier called such bf16 near-ties mismatches).

The reference is the batch-invariant target wherever it runs (every dtype on a CPU): its chain rows are bit
for bit its one-token decodes, so a `--batch-invariant on` run replays with no token off at all, and any
run's off tokens are measured against exact greedy decoding. On CUDA the construction is not measured exact,
and the reference is the plain target: a verify row there is a decode up to rounding, which the tie
threshold covers. Unlike report's first-divergence classifier this checks every token, not only the first
one that leaves the baseline's text, and needs no baseline run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specbench_cli.analysis.divergence import threshold
from specbench_cli.core.target import Target
from specbench_cli.core.tree import DraftTree
from specbench_cli.core.turn import TurnResult

if TYPE_CHECKING:
    from specbench_cli.inputs import RunConfig

CHAIN = 64  # output tokens per verify of the replay (the batch-invariant target's probes cover up to 130 rows)


@dataclass(frozen=True)
class Replayed:
    """One turn's replay: prompts.parquet's replay_* columns."""

    checked: int  # tokens compared (every emitted token)
    off: int  # tokens that are not the reference's greedy choice after the turn's earlier tokens
    ties: int  # of them: within the dtype's tie threshold of the reference's top logit
    first_off: int  # position of the first off token in the output; -1: none
    margin: float  # the largest reference logit margin (its choice minus the emitted token) of an off token; 0: none
    # another engine's turn: how far its own verify of the turn (`engines.vllm.Worker.score`) is from the
    # reference's logits, as the largest error of a margin between two of its top tokens (`engine_error`); NaN: ours
    engine_error: float = float("nan")

    @property
    def mismatches(self) -> int:
        return self.off - self.ties


NOT_REPLAYED = Replayed(-1, -1, -1, -1, float("nan"))  # temperature > 0, --no-replay, or another engine's turn


def replay_columns(replayed: Replayed) -> dict:
    """A turn's replay as prompts.parquet's replay_* columns (`records.PromptRecord`)."""
    return {"replay_checked": replayed.checked, "replay_off": replayed.off, "replay_ties": replayed.ties,
            "replay_first_off": replayed.first_off, "replay_margin": replayed.margin,
            "replay_engine_error": replayed.engine_error}


def replays(config: RunConfig) -> bool:
    """Whether a run (`inputs.RunConfig`) replays its turns: asked for, greedy, and on one device (a --device split
    target is for acceptance studies) and not a set acceptance's (not lossless by construction)."""
    return config.replay and config.temperature == 0 and config.device != "split" and not config.acceptance


def replay_off(config: RunConfig) -> str:
    """run.json's `replay` for a run that does not replay, and why where it is not the user's choice."""
    return "off: --acceptance sets the decisions, not lossless by construction" if config.acceptance else "off"


def reference(device: torch.device) -> str:
    """The reference a replay on `device` runs (run.json's `replay`): the batch-invariant target is measured
    exact on a CPU only."""
    return "batch-invariant target (exact)" if device.type == "cpu" else "plain target (ties up to rounding)"


class Replayer:
    """A reference target of its own (its own cache) over the run's model, replaying turns one after another."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.reference = reference(device)
        self.target = Target(model, device, invariant=device.type == "cpu")  # eager, packed where it can be
        self.limit = threshold(str(model.get_input_embeddings().weight.dtype))

    def turns(self, turns: list[tuple[list[int], TurnResult]], scores: list | None = None) -> list[Replayed]:
        """A conversation's turns (each turn's prompt ids and result), one replay each; `scores`: another engine's
        log-probabilities of each turn (`engine_error`)."""
        return [self.check(ids, r.output_ids, scores[i] if scores else None) for i, (ids, r) in enumerate(turns)]

    @torch.inference_mode()
    def check(self, prompt_ids: list[int], output_ids: list[int],
              engine: list[dict[int, float]] | None = None) -> Replayed:
        """Every token of `output_ids` against the reference's greedy choice after `prompt_ids` and the tokens
        before it; with `engine` (another engine's log-probabilities of its top tokens at each output position),
        also how far that engine's logits are from the reference's (`engine_error`)."""
        if not output_ids:
            return Replayed(0, 0, 0, -1, 0.0)
        t, n = self.target, len(output_ids)
        rows = [t.prefill(prompt_ids, room=n + CHAIN)[None]]  # the prefill's logits choose output token 0
        k = 0  # output token k is the next root: emitted, not yet in the cache
        while k + 1 < n:  # a verify of root k and the chain after it gives the logits of tokens k+1 .. k+len+1
            chain = output_ids[k + 1:k + CHAIN]
            rows.append(t.verify(output_ids[k], DraftTree.chain(chain))[:n - k - 1])
            t.commit(list(range(len(chain) + 1)))
            k += len(chain) + 1
        logits = torch.cat(rows).float().cpu()
        replayed = self._compare(logits, output_ids)
        return replayed if engine is None else dataclasses.replace(replayed, engine_error=engine_error(logits, engine))

    def _compare(self, logits: torch.Tensor, output_ids: list[int]) -> Replayed:
        """logits [n, V]: row i the reference's logits for output token i."""
        emitted = torch.tensor(output_ids)
        chosen = logits.argmax(-1)  # the first of equal maxima, as a run's greedy pick takes it (`core.turn.pick`)
        off = (chosen != emitted).nonzero().flatten()
        if not len(off):
            return Replayed(len(output_ids), 0, 0, -1, 0.0)
        margins = logits[off, chosen[off]] - logits[off, emitted[off]]
        # a tie: a few units in the last place of the top logit below it (in bf16 a third logit can sit in the
        # same unit as the top two, so its rank is not asked)
        ties = margins < self.limit
        return Replayed(len(output_ids), len(off), int(ties.sum()), int(off[0]), float(margins.max()))


def engine_error(logits: torch.Tensor, engine: list[dict[int, float]]) -> float:
    """How far another engine's logits are from the reference's `logits` [n, V] over the same tokens, from that
    engine's log-probabilities of its top tokens at each position (`engine`, one dict per row): at a position, the
    differences d(t) = its log-prob of t minus the reference's share one offset (each side's normaliser), so
    max d - min d over its tokens is the largest error any margin between two of them suffers there. The largest
    over the positions: a turn of that engine whose tokens leave the reference's by no more than this (in
    logits) is explained by that engine's numerics, and one that leaves by more is not."""
    reference = torch.log_softmax(logits, dim=-1)
    worst = 0.0
    for row, scored in zip(reference, engine):
        if len(scored) > 1:
            tokens = torch.tensor(list(scored))
            d = torch.tensor(list(scored.values()), dtype=torch.float64) - row[tokens].double()
            worst = max(worst, float(d.max() - d.min()))
    return worst
