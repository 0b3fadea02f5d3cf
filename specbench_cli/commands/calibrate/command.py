"""`specbench calibrate`: the routers' thresholds and the WhiFlash neural router, from trace replay.

Both WhiFlash policies are calibrated from the same ingredients:
- replay of EAGLE-3 and DFlash over calibration prompts (`specbench oracle` in-process): AL_e(t), AL_d(t),
  the target's entropy and final hidden state at every position;
- measured latencies on this machine: the mean round time of each drafter (a short live run of each) and
  the cost of a lazy catch-up per backlog token (EAGLE-3's KV-only prefill timed on backlogs of 1..512).
A route over a replayed turn is then simulated exactly as the decode loop would run it (position t →
t + AL + 1 with the chosen drafter, plus catch-up cost after an idle stretch), giving its tokens per second.

- whiflash-entropy: per category, the threshold_entropy maximising simulated throughput over a grid of entropy
  quantiles; the best `--confirm` values are then decoded for real and the fastest measured one kept.
  Calibration prompts are each category's LAST `--per-category` prompts of the dataset (runs with --limit
  take prompts from the front); their ids are in the card.
- whiflash-neural: the router MLP trained on (h_t, ΔAL_t = AL_e − AL_d) pairs from task-agnostic training
  prompts (datasets/train, past the ones the embedded drafters were distilled on), AdamW, MSE, peak lr
  1e-3 (WhiFlash's settings, fewer steps for a CPU); threshold_ΔAL is the break-even of the two drafters'
  measured throughputs: EAGLE-3 pays when ΔAL > (L_e / L_d − 1)(ĀL_d + 1). The Table 2 sweep
  threshold_ΔAL ∈ {−1, −0.5, 0, 0.5, 1, 1.5, 2} is simulated on the held-out pairs.

Artifacts land in the project's drafters/<model>/<method>/ unless --out says otherwise (`models.drafter_folder`;
config.json = card with data, settings and metrics; router.safetensors for the neural router; sweep.csv),
where `run` finds them. HVD's payoff predictor is
calibrated from the same pieces (replay, measured latencies, simulation, `fit`) in `calibration/hvd.py`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from rich.console import Console

from specbench_cli.analysis.metrics import tau

TABLE2_THRESHOLDS = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)  # WhiFlash Table 2's threshold_ΔAL sweep


@dataclass
class Latency:
    """Measured costs on this machine (ms). `other` is the drafter EAGLE-3 is routed against (WhiFlash: DFlash,
    HVD: the suffix cache)."""

    eagle3: float  # mean round time of an EAGLE-3 round
    other: float  # mean round time of the other drafter's round
    catchup_per_token: float  # EAGLE-3 KV-only prefill, per backlog token
    other_name: str = "dflash"

    def as_dict(self) -> dict:
        return {"eagle3_round_ms": self.eagle3, f"{self.other_name}_round_ms": self.other,
                "catchup_ms_per_backlog_token": self.catchup_per_token}

    @classmethod
    def from_dict(cls, d: dict, other_name: str) -> Latency:
        return cls(d["eagle3_round_ms"], d[f"{other_name}_round_ms"], d["catchup_ms_per_backlog_token"], other_name)


# ---------------------------------------------------------------------------------------------- simulation
def round_starts(al_e: np.ndarray, al_d: np.ndarray, use_eagle3: np.ndarray) -> list[tuple[int, bool]]:
    """(position, EAGLE-3?) of every round of a routed decode of one replayed turn (al_d: the other drafter's
    ALs): a round starting at t with drafter d ends after AL_d(t) accepted tokens and the bonus."""
    t, starts = 0, []
    while t < len(al_e):
        eagle3 = bool(use_eagle3[t])
        starts.append((t, eagle3))
        t += int((al_e if eagle3 else al_d)[t]) + 1
    return starts


def simulate(al_e: np.ndarray, al_d: np.ndarray, use_eagle3: np.ndarray, lat: Latency) -> tuple[int, int, float]:
    """(tokens, rounds, ms) of a routed decode of one replayed turn: at each round start t the route says
    which drafter drafts; EAGLE-3 coming back after an idle stretch first catches up on the positions since
    it last drafted."""
    starts = round_starts(al_e, al_d, use_eagle3)
    ms = 0.0
    eagle_at = 0  # the position up to which EAGLE-3's cache is current
    for t, eagle3 in starts:
        if eagle3:
            ms += lat.eagle3 + lat.catchup_per_token * max(t - eagle_at, 0)
            eagle_at = t + int(al_e[t]) + 1
        else:
            ms += lat.other
    return len(al_e), len(starts), ms


def throughput(turns: list[tuple[np.ndarray, np.ndarray, np.ndarray]], lat: Latency) -> tuple[float, float]:
    """(tokens/s, τ) over turns of (al_e, al_d, use_eagle3)."""
    tokens = rounds = 0
    ms = 0.0
    for al_e, al_d, use in turns:
        a, b, c = simulate(al_e, al_d, use, lat)
        tokens, rounds, ms = tokens + a, rounds + b, ms + c
    return tokens / (ms / 1e3) if ms else 0.0, tau(tokens, rounds)


def accepted_wide(oracle_dir: Path) -> pd.DataFrame:
    """Replay as one row per (prompt, turn, position) and one AL column per drafter."""
    replay = pd.read_parquet(oracle_dir / "replay.parquet")
    return replay.pivot_table(index=["prompt_id", "turn", "position"], columns="drafter", values="accepted").reset_index()


def replayed_turns(oracle_dir: Path) -> pd.DataFrame:
    """One row per replayed turn: category, al_e, al_d (arrays), entropy and hidden (arrays)."""
    signals = pd.read_parquet(oracle_dir / "signals.parquet")
    merged = signals.merge(accepted_wide(oracle_dir), on=["prompt_id", "turn", "position"])
    merged = merged.sort_values(["prompt_id", "turn", "position"])
    rows = []
    for (pid, turn), g in merged.groupby(["prompt_id", "turn"], sort=False):
        rows.append({"prompt_id": pid, "turn": turn, "category": g.category.iloc[0],
                     "al_e": g.eagle3.to_numpy(int), "al_d": g.dflash.to_numpy(int),
                     "entropy": g.entropy.to_numpy(float), "hidden": np.stack(g.hidden.to_numpy())})
    return pd.DataFrame(rows)


def entropy_sweep(turns: pd.DataFrame, lat: Latency, grid: list[float]) -> pd.DataFrame:
    """Simulated tokens/s and τ per category (and overall) for every threshold of the grid."""
    rows = []
    for category, g in [*turns.groupby("category"), ("overall", turns)]:
        for tau in grid:
            speed, t = throughput([(r.al_e, r.al_d, r.entropy > tau) for r in g.itertuples()], lat)
            rows.append({"category": category, "threshold": tau, "tokens_per_s": speed, "tau": t,
                         "eagle3_share": float(np.mean(np.concatenate([r.entropy > tau for r in g.itertuples()])))})
    return pd.DataFrame(rows)


def entropy_grid(turns: pd.DataFrame, n: int = 19) -> list[float]:
    """Quantiles of the observed entropies, plus 'always EAGLE-3' (−1) and 'always DFlash' (+∞ stand-in)."""
    values = np.concatenate(turns.entropy.to_numpy())
    qs = np.quantile(values, np.linspace(0.05, 0.95, n))
    return [-1.0, *sorted(set(np.round(qs, 4).tolist())), float(values.max() + 1.0)]


# ---------------------------------------------------------------------------------------------- learned policies
def fit(make, inputs: np.ndarray, targets: np.ndarray, steps: int, lr: float = 1e-3, seed: int = 0,
        batch: int = 256, progress=None, validation: tuple[np.ndarray, np.ndarray] | None = None, every: int = 50):
    """Fit `make(n_inputs)` (a `specbench_methods.predictors.Standardised`) to the targets with MSE: AdamW, linear
    warm-up then cosine decay to 0 (WhiFlash's and HVD's recipe). With `validation` pairs, the weights with
    the lowest validation MSE (checked every `every` steps) are kept: a few thousand pairs overfit these MLPs
    long before the schedule ends."""
    torch.manual_seed(seed)
    x, y = torch.tensor(inputs, dtype=torch.float32), torch.tensor(targets, dtype=torch.float32)
    module = make(x.shape[1])
    module.fit_scale(x)
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.01)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm))))
    gen = torch.Generator().manual_seed(seed)
    best = (math.inf, None)
    for step in range(steps):
        module.train()
        idx = torch.randint(0, len(x), (min(batch, len(x)),), generator=gen)
        loss = torch.nn.functional.mse_loss(module(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if validation is not None and ((step + 1) % every == 0 or step + 1 == steps):
            mse = _mse(module, *validation)
            if mse < best[0]:
                best = (mse, {k: v.clone() for k, v in module.state_dict().items()})
        if progress:
            progress(step + 1, float(loss.detach()))
    if best[1] is not None:
        module.load_state_dict(best[1])
    return module.eval()


def _mse(router, x: np.ndarray, y: np.ndarray) -> float:
    router.eval()
    with torch.inference_mode():
        return float(np.mean((router(torch.tensor(x, dtype=torch.float32)).numpy() - y) ** 2))


def least_prompts(method: str) -> int:
    """The fewest `--prompts` a calibration can use: a learned policy (whiflash-neural, hvd) holds its first prompt
    out for the test (`held_out`), so it needs a second to train on; whiflash-entropy's is per category."""
    return 2 if method in ("whiflash-neural", "hvd") else 1


def held_out(prompt_ids: list[str]) -> tuple[set[str], set[str]]:
    """(test, validation) prompts of a learned policy's calibration: every 8th prompt is held out for the
    metrics and the sweep, every 8th from the 5th stops training early (none under 5 prompts)."""
    return set(prompt_ids[::8]), set(prompt_ids[4::8])


def break_even_threshold(lat: Latency, mean_al_d: float) -> float:
    """ΔAL above which an EAGLE-3 round yields more tokens per ms than a DFlash round at DFlash's mean AL."""
    return (lat.eagle3 / lat.other - 1.0) * (mean_al_d + 1.0)


# ---------------------------------------------------------------------------------------------- measuring
def catchup_cost(eagle3, backlogs=(1, 64, 512), reps: int = 5) -> float:
    """ms per backlog token of EAGLE-3's KV-only prefill (`kv_only_probe`; slope of a least-squares line over
    backlogs)."""
    device = eagle3.model.device
    times = []
    for b in backlogs:
        probe = eagle3.kv_only_probe(b)
        probe()
        t0 = time.perf_counter()
        for _ in range(reps):
            probe()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) / reps * 1e3)
    slope = np.polyfit(np.array(backlogs, float), np.array(times), 1)[0]
    return float(max(slope, 0.0))


def round_ms(run_dir: Path) -> float:
    from specbench_cli.records import read_table

    return float(read_table(run_dir, "rounds").wall_ms.mean())


def card(config: CalibrateConfig, drafters: tuple[str, ...], **fields) -> dict:
    """The artifact's config.json. `drafters`: the model's registered drafters the calibration measured;
    their fingerprints let a run warn when it loads other weights than these."""
    from specbench_methods.checkpoints import fingerprint, locate, timed_as
    from specbench_cli.hardware import environment
    from specbench_cli.models import get_model_spec
    from specbench_cli.commands.train.train import command_line

    refs = get_model_spec(config.model).drafters
    timed = config.target()
    return {"method": config.method, "model": config.model, "created": dt.datetime.now().isoformat(timespec="seconds"),
            "command": command_line(), "environment": environment(torch.device("cpu")),
            "latency_dtype": timed_as(timed.dtype, timed.device),  # a run in another dtype is warned (warn_if_stale)
            "drafters": {name: fingerprint(locate(refs[name], name)) for name in drafters}, **fields}


def write_artifact(folder: Path, config: dict, sweep: pd.DataFrame, module=None) -> None:
    """config.json (the card), sweep.csv, the sensitivity plot and the learned policy's weights if any."""
    folder.mkdir(parents=True, exist_ok=True)
    if module is not None:
        module.save(folder)
    sweep.to_csv(folder / "sweep.csv", index=False)
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))
    from specbench_cli.analysis import plots

    plots.save(plots.threshold_sensitivity(sweep, config["method"]), folder, "sensitivity")


# ---------------------------------------------------------------------------------------------- orchestration
@dataclass
class CalibrateConfig:
    method: str
    model: str
    dataset: str  # whiflash-entropy: the dataset whose categories get thresholds
    prompts: int  # whiflash-neural, hvd: training prompts replayed; whiflash-entropy: prompts per category
    max_new_tokens: int
    steps: int  # whiflash-neural, hvd: optimiser steps
    confirm: int  # whiflash-entropy: best simulated thresholds decoded for real per category
    work: Path  # replay and latency runs (resumable)
    out: Path  # the artifact folder
    dtype: str = "auto"  # the latencies' dtype: that of the runs the calibration is for (run's --dtype)
    loaded: dict = field(default_factory=dict)  # the target by dtype, loaded on first use and shared

    def target(self, replay: bool = False):
        """The target on the default device in `dtype`, where the latencies are timed; `replay`: in the
        oracle's default dtype (float32 on the CPU, where a replay equals a live run exactly; the acceptance it
        measures carries over to a bf16 run up to its rare ties)."""
        from specbench_cli.loading import load_model, resolve_device, resolve_dtype
        from specbench_cli.models import get_model_spec

        device = resolve_device("auto")
        dtype = resolve_dtype("auto", device, cpu_bf16=False) if replay else resolve_dtype(self.dtype, device)
        dtype = dtype.dtype
        if dtype not in self.loaded:
            self.loaded[dtype] = load_model(get_model_spec(self.model), device, dtype)
        return self.loaded[dtype]


def write_prompts(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def calibration_prompts(config: CalibrateConfig) -> list[dict]:
    """whiflash-entropy: each category's last `prompts` prompts; whiflash-neural and hvd: the training files'
    calibration share, which no drafter trains on (and never an evaluation set)."""
    if config.method in ("whiflash-neural", "hvd"):
        from specbench_cli.commands.train.distill import calibration_prompts as held_prompts

        texts = held_prompts(config.prompts)
        return [{"id": f"train-{i}", "category": "train", "turns": [t]} for i, t in enumerate(texts)]
    from specbench_cli.datasets import load_dataset

    by_category: dict[str, list] = {}
    for p in load_dataset(config.dataset):
        by_category.setdefault(p.category, []).append(p)
    return [{"id": p.id, "category": p.category, "turns": list(p.turns)}
            for ps in by_category.values() for p in ps[-config.prompts:]]


def measure(config: CalibrateConfig, prompts_file: Path, console: Console, other: str = "dflash",
            eagle3_opts: tuple[str, ...] = ()) -> tuple[Path, Latency]:
    """Replay EAGLE-3 (with `eagle3_opts`) and `other` over the prompts into <work>/oracle, and time both
    drafters' rounds and EAGLE-3's catch-up on this machine (cached in <work>/latency.json)."""
    from specbench_methods.eagle3 import Eagle3
    from specbench_cli.commands.oracle import command as oracle_run
    from specbench_cli.inputs import RunConfig

    oracle_dir = config.work / "oracle"
    oracle_run.run_oracle(oracle_run.OracleConfig(["eagle3", other], RunConfig(
        model=config.model, dataset=str(prompts_file), max_new_tokens=config.max_new_tokens, warmup=0,
        out=oracle_dir, resume=(oracle_dir / "run.json").exists()), [f"eagle3.{o}" for o in eagle3_opts]), console,
        config.target(replay=True))
    rounds = {m: round_ms(live_run(config, prompts_file, m, config.work / f"latency_{m}", list(opts), console))
              for m, opts in (("eagle3", eagle3_opts), (other, ()))}
    cached = config.work / "latency.json"  # measured once per work folder, so a re-fit never re-times
    if not cached.exists():
        cost = catchup_cost(Eagle3(Eagle3.Options(), config.target(), {}))
        cached.write_text(json.dumps(Latency(rounds["eagle3"], rounds[other], cost, other).as_dict()))
    return oracle_dir, Latency.from_dict(json.loads(cached.read_text()), other)


def live_run(config: CalibrateConfig, prompts_file: Path, method: str, out: Path, opts: list[str], console: Console,
             categories: list[str] | None = None, warmup: int = 1) -> Path:
    """A short real decode (2 prompts, ≤ 96 tokens) of the calibration prompts; resumed if it exists."""
    from specbench_cli.inputs import RunConfig
    from specbench_cli.planning import plan
    from specbench_cli.run_folder import record_run

    record_run(plan(RunConfig(method=method, model=config.model, dataset=str(prompts_file), categories=categories or [],
                           limit=2, max_new_tokens=min(config.max_new_tokens, 96), warmup=warmup, opts=opts, out=out,
                           dtype=config.dtype,
                           resume=(out / "run.json").exists()), {}), console, config.target())
    return out


def calibrate_entropy(config: CalibrateConfig, console: Console) -> dict:
    prompts = calibration_prompts(config)
    prompts_file = write_prompts(config.work / "prompts.jsonl", prompts)
    oracle_dir, lat = measure(config, prompts_file, console)
    turns = replayed_turns(oracle_dir)
    sweep = entropy_sweep(turns, lat, entropy_grid(turns))
    best = {}
    for category, g in sweep.groupby("category"):
        top = g.sort_values("tokens_per_s", ascending=False).head(max(config.confirm, 1))
        best[category] = confirm_live(config, prompts_file, category, top.threshold.tolist(), console) \
            if config.confirm and category != "overall" else float(top.threshold.iloc[0])
    config_json = card(config, ("eagle3", "dflash"), threshold=best.pop("overall"), thresholds=best,
                       latency=lat.as_dict(), dataset=config.dataset, prompts=[p["id"] for p in prompts],
                       max_new_tokens=config.max_new_tokens, confirm=config.confirm,
                       simulated_best=_best_rows(sweep))
    write_artifact(config.out, config_json, sweep)
    console.print(f"entropy threshold overall {config_json['threshold']:.3f}; per category "
                  + ", ".join(f"{k} {v:.3f}" for k, v in config_json["thresholds"].items()), highlight=False)
    return config_json


def confirm_live(config: CalibrateConfig, prompts_file: Path, category: str, thresholds: list[float],
                 console: Console) -> float:
    """Decode the category's calibration prompts with each candidate threshold; keep the fastest measured."""
    from specbench_cli.records import read_table

    speeds = {}
    for tau in thresholds:
        out = live_run(config, prompts_file, "whiflash-entropy", config.work / f"confirm_{category}_{tau:.4f}",
                       [f"threshold={tau}"], console, categories=[category], warmup=0)
        prompts = read_table(out, "prompts")
        speeds[tau] = prompts.decode_tokens.sum() / (prompts.decode_ms.sum() / 1e3)
    return max(speeds, key=speeds.get)


def calibrate_neural(config: CalibrateConfig, console: Console) -> dict:
    prompts = calibration_prompts(config)
    prompts_file = write_prompts(config.work / "prompts.jsonl", prompts)
    oracle_dir, lat = measure(config, prompts_file, console)
    turns = replayed_turns(oracle_dir)
    test_ids, val_ids = held_out(list(turns.prompt_id.drop_duplicates()))
    test, val = turns[turns.prompt_id.isin(test_ids)], turns[turns.prompt_id.isin(val_ids)]
    train = turns[~turns.index.isin(test.index) & ~turns.index.isin(val.index)]

    def pairs(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        return (np.concatenate(frame.hidden.to_numpy()),
                np.concatenate([r.al_e - r.al_d for r in frame.itertuples()]).astype(np.float32))

    x, y = pairs(train)
    from specbench_methods.predictors import Router
    from specbench_cli.progress import progress_bar

    with progress_bar(console) as bar:
        task = bar.add_task("training the router", total=config.steps, stats="")
        router = fit(Router, x, y, config.steps, validation=pairs(val) if len(val) else None,
                              progress=lambda step, loss: bar.update(task, completed=step, stats=f"mse {loss:.3f}"))
    with torch.inference_mode():
        predict = {r.Index: router(torch.tensor(r.hidden, dtype=torch.float32)).numpy() for r in test.itertuples()}
    truth = np.concatenate([r.al_e - r.al_d for r in test.itertuples()])
    guess = np.concatenate([predict[i] for i in test.index])
    tau = break_even_threshold(lat, float(np.concatenate(train.al_d.to_numpy()).mean()))
    rows = []
    for threshold in sorted({*TABLE2_THRESHOLDS, round(tau, 4)}):
        speed, t = throughput([(r.al_e, r.al_d, predict[r.Index] > threshold) for r in test.itertuples()], lat)
        rows.append({"threshold": threshold, "tokens_per_s": speed, "tau": t,
                     "eagle3_share": float(np.mean(np.concatenate([predict[i] > threshold for i in test.index])))})
    statics = {name: throughput([(r.al_e, r.al_d, np.full(len(r.al_e), name == "eagle3")) for r in test.itertuples()], lat)
               for name in ("eagle3", "dflash")}
    config_json = card(config, ("eagle3", "dflash"), hidden_size=int(x.shape[1]), dropout=0.1, threshold=tau, latency=lat.as_dict(), steps=config.steps, lr=1e-3,
                       train_pairs=int(len(y)), validation_pairs=int(len(pairs(val)[1])) if len(val) else 0, heldout_pairs=int(len(truth)),
                       heldout_mse=float(np.mean((guess - truth) ** 2)),
                       heldout_mse_of_mean=float(np.mean((y.mean() - truth) ** 2)),
                       heldout_sign_agreement=float(np.mean(np.sign(guess) == np.sign(truth))),
                       heldout_static={k: {"tokens_per_s": v[0], "tau": v[1]} for k, v in statics.items()},
                       prompts=len(prompts), max_new_tokens=config.max_new_tokens)
    write_artifact(config.out, config_json, pd.DataFrame(rows), router)
    console.print(f"ΔAL threshold {config_json['threshold']:.3f}; held-out MSE {config_json['heldout_mse']:.3f} "
                  f"(predicting the mean: {config_json['heldout_mse_of_mean']:.3f})", highlight=False)
    return config_json


def _best_rows(sweep: pd.DataFrame) -> dict:
    best = sweep.loc[sweep.groupby("category").tokens_per_s.idxmax()]
    return {r.category: {"threshold": r.threshold, "tokens_per_s": r.tokens_per_s, "tau": r.tau} for r in best.itertuples()}
