"""`specbench calibrate --method hvd`: Hybrid Verified Decoding's payoff predictor, from trace replay.

Labels: `specbench oracle` replays the suffix cache over greedy traces of training prompts; at every decode
position it records the cache draft (score, matched length, tokens) and its accepted length y = the longest
path of the draft that matches the trace (HVD's payoff label). EAGLE-3 (in HVD's tree setting) is replayed too,
so a routed decode of every turn can be simulated exactly.

Features: `specbench_methods.hvd_features.features`, the function `hvd` calls live. Its history terms (recent cache selection
rate and accepted lengths) depend on the route taken, so each turn is rolled out as HVD would decode it —
round after round, the route choosing by a policy — and a position's history is that of the rounds finished
before it. The first rollout uses the frequency rule (`hvd-freq`), the second the predictor fitted on the
first; the predictor is refitted on both (one DAgger step: it learns on the histories it will itself cause).

Training: MSE, AdamW, lr 1e-3 with warm-up and cosine decay, best-validation weights kept (the recipe
`calibrate.fit` shares with WhiFlash's router). Held out: every 8th prompt. The card reports HVD Table 2's
quality columns at threshold 6 on held-out positions (P(y ≥ 6), P(ŷ ≥ 6), precision, recall), and a simulated
Table 11-style comparison (tokens/s, target cycles per 1K tokens, τ, cache and EAGLE-3 shares) of hvd at
each threshold of the sweep against EAGLE-3 alone, cache-first (the cache draft whenever there is one, else EAGLE-3)
and hvd-freq, from the measured latencies. The simulation charges an EAGLE-3 round its measured time only:
the per-round cache lookup and predictor (`route_ms` in live runs) are not added.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from rich.console import Console

from specbench_cli.commands.calibrate.command import (CalibrateConfig, Latency, accepted_wide, calibration_prompts, card, fit,
                                     held_out, measure, round_starts, simulate, write_artifact, write_prompts)
from specbench_cli.analysis.metrics import tau

PAYOFF = 6.0  # HVD's threshold (its τ): verify the cache draft when ŷ ≥ 6; also Table 2's "high payoff" line y ≥ 6
THRESHOLDS = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0)  # the sensitivity sweep of the threshold
EAGLE3_SETTING = ("depth=8", "top_k=4", "total_token=32")  # HVD's EAGLE-3 (see HybridVerified.Options)


@dataclass
class CacheTurn:
    """One replayed turn: per decode position, the cache draft and both drafters' accepted lengths."""

    prompt_id: str
    prompt_len: int
    al_e: np.ndarray  # EAGLE-3's AL at each position
    al_s: np.ndarray  # the cache draft's AL (the payoff label)
    score: np.ndarray
    match_len: np.ndarray
    drafts: list[list[int]]


def cache_turns(oracle_dir: Path) -> list[CacheTurn]:
    drafts = pd.read_parquet(oracle_dir / "drafts.parquet")
    merged = drafts.merge(accepted_wide(oracle_dir), on=["prompt_id", "turn", "position"])
    turns = []
    for (pid, _), g in merged.sort_values(["prompt_id", "turn", "position"]).groupby(["prompt_id", "turn"], sort=False):
        turns.append(CacheTurn(pid, int(g.prompt_len.iloc[0]), g.eagle3.to_numpy(int), g.suffix.to_numpy(int),
                               g.score.to_numpy(float), g.match_len.to_numpy(int), [list(map(int, d)) for d in g.draft]))
    return turns


Decide = Callable[[np.ndarray], np.ndarray]  # features [N, F] → verify the cache draft? [N]


def rollout(turn: CacheTurn, classes: np.ndarray, decide: Decide) -> tuple[np.ndarray, np.ndarray]:
    """Features at every position and the route's choice there, as an HVD decode of the turn sees them: the
    history terms count the rounds finished before the position (the route's rounds, chosen by `decide`)."""
    from specbench_methods.hvd_features import History, features

    history, end, finished = History(), 0, None
    rows, chose = [], []
    for t in range(len(turn.al_s)):
        if finished is not None and t == end:
            history.add(*finished)
        x = features(float(turn.score[t]), int(turn.match_len[t]), turn.drafts[t], turn.prompt_len, t + 1, history, classes)
        cache = bool(turn.drafts[t]) and bool(decide(x[None])[0])
        rows.append(x)
        chose.append(cache)
        if t == end:  # a round of the rollout starts here
            accepted = int(turn.al_s[t] if cache else turn.al_e[t])
            finished, end = (cache, accepted), t + accepted + 1
    return np.stack(rows), np.array(chose)


def samples(turns: list[CacheTurn], classes: np.ndarray, decide: Decide) -> tuple[np.ndarray, np.ndarray]:
    """(features, payoff) at every position whose cache draft is not empty."""
    xs, ys = [], []
    for turn in turns:
        x, _ = rollout(turn, classes, decide)
        keep = np.array([bool(d) for d in turn.drafts])
        xs.append(x[keep])
        ys.append(turn.al_s[keep].astype(np.float32))
    return np.concatenate(xs), np.concatenate(ys)


def frequency_rule(depth: int = 8) -> Decide:
    from specbench_methods.hvd_features import FEATURES

    column = FEATURES.index("suffix_score")
    return lambda x: x[:, column] >= depth


def predictor_rule(predictor, tau: float) -> Decide:
    def decide(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return predictor(torch.from_numpy(x)).numpy() >= tau
    return decide


def quality(y: np.ndarray, y_hat: np.ndarray, line: float = PAYOFF) -> dict:
    """HVD Table 2's columns: how often the payoff is high, how often it is predicted high, and how right."""
    high, predicted = y >= line, y_hat >= line
    return {"p_high": float(high.mean()), "p_predicted_high": float(predicted.mean()),
            "precision": float((high & predicted).sum() / max(predicted.sum(), 1)),
            "recall": float((high & predicted).sum() / max(high.sum(), 1)),
            "mse": float(np.mean((y_hat - y) ** 2)), "positions": int(len(y))}


def simulated(turns: list[CacheTurn], classes: np.ndarray, decide: Decide, lat: Latency) -> dict:
    """Table 11's columns for a routed decode of the turns: tokens/s, target cycles per 1K tokens, τ, and the
    share of rounds that verified the cache draft (the rest drafted with EAGLE-3)."""
    tokens = rounds = cache_rounds = 0
    ms = 0.0
    for turn in turns:
        _, chose = rollout(turn, classes, decide)
        n, r, t_ms = simulate(turn.al_e, turn.al_s, ~chose, lat)
        tokens, rounds, ms = tokens + n, rounds + r, ms + t_ms
        cache_rounds += sum(not eagle3 for _, eagle3 in round_starts(turn.al_e, turn.al_s, ~chose))
    return {"tokens_per_s": tokens / (ms / 1e3) if ms else 0.0, "cycles_per_1k": 1e3 * rounds / max(tokens, 1),
            "tau": tau(tokens, rounds), "cache_share": cache_rounds / max(rounds, 1),
            "eagle3_share": 1 - cache_rounds / max(rounds, 1)}


def token_table(model_name: str) -> np.ndarray:
    """The vocabulary's class table of the model's tokenizer (specbench_methods.hvd_features.token_classes)."""
    from transformers import AutoConfig, AutoTokenizer

    from specbench_methods.hvd_features import token_classes
    from specbench_cli.loading import checkpoint_location
    from specbench_cli.models import get_model_spec

    where = checkpoint_location(get_model_spec(model_name))
    return token_classes(AutoTokenizer.from_pretrained(where), int(AutoConfig.from_pretrained(where).vocab_size))


def calibrate_hvd(config: CalibrateConfig, console: Console) -> dict:
    from specbench_methods.hvd_features import FEATURES
    from specbench_methods.predictors import PayoffPredictor
    from specbench_cli.progress import progress_bar

    prompts = calibration_prompts(config)
    prompts_file = write_prompts(config.work / "prompts.jsonl", prompts)
    oracle_dir, lat = measure(config, prompts_file, console, other="suffix", eagle3_opts=EAGLE3_SETTING)
    turns, classes = cache_turns(oracle_dir), token_table(config.model)
    test_ids, val_ids = held_out(list(dict.fromkeys(t.prompt_id for t in turns)))
    test = [t for t in turns if t.prompt_id in test_ids]
    val = [t for t in turns if t.prompt_id in val_ids]
    train = [t for t in turns if t.prompt_id not in test_ids | val_ids]

    predictor, collected = None, []
    with progress_bar(console) as bar:
        for rollout_no, rule in enumerate(("frequency rule", "fitted predictor")):
            decide = frequency_rule() if predictor is None else predictor_rule(predictor, PAYOFF)
            collected.append(samples(train, classes, decide))
            x, y = (np.concatenate(parts) for parts in zip(*collected))
            task = bar.add_task(f"payoff predictor, rollout {rollout_no + 1} ({rule})", total=config.steps, stats="")
            validation = samples(val, classes, decide) if val else None
            predictor = fit(PayoffPredictor, x, y, config.steps, validation=validation,
                            progress=lambda step, loss: bar.update(task, completed=step, stats=f"mse {loss:.3f}"))
    final = predictor_rule(predictor, PAYOFF)
    x_test, y_test = samples(test, classes, final)
    with torch.inference_mode():
        y_hat = predictor(torch.from_numpy(x_test)).numpy()
    rows = [{"threshold": tau, **simulated(test, classes, predictor_rule(predictor, tau), lat)} for tau in THRESHOLDS]
    statics = {"eagle3": simulated(test, classes, lambda x: np.zeros(len(x), bool), lat),
               # the cache draft whenever there is one (ArcticInference's hybrid with min_score 0)
               "cache-first": simulated(test, classes, lambda x: np.ones(len(x), bool), lat),
               "hvd-freq": simulated(test, classes, frequency_rule(), lat),
               "hvd": next(r for r in rows if r["threshold"] == PAYOFF)}
    config_json = card(config, ("eagle3",), features=list(FEATURES), width=256, threshold=PAYOFF,
                       latency=lat.as_dict(), eagle3_setting=list(EAGLE3_SETTING), steps=config.steps, lr=1e-3,
                       train_positions=int(len(y)), heldout_quality=quality(y_test, y_hat),
                       heldout_mse_of_mean=float(np.mean((y.mean() - y_test) ** 2)),
                       heldout_simulated=statics, prompts=len(prompts), max_new_tokens=config.max_new_tokens)
    write_artifact(config.out, config_json, pd.DataFrame(rows), predictor)
    q = config_json["heldout_quality"]
    console.print(f"held-out payoff at threshold {config_json['threshold']:g}: P(y ≥ it) {q['p_high']:.3f}, P(ŷ ≥ it) "
                  f"{q['p_predicted_high']:.3f}, precision {q['precision']:.3f}, recall {q['recall']:.3f}; "
                  f"MSE {q['mse']:.3f} (predicting the mean: {config_json['heldout_mse_of_mean']:.3f})", highlight=False)
    return config_json
