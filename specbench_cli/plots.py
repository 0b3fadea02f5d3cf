"""The report's figures, each saved as PNG and PDF, with labelled axes, units and a legend, so they read
without the code: speedup and τ per category, τ along a response, phase breakdown, acceptance survival."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from specbench_cli.metrics import survival  # noqa: E402
from specbench_cli.phases import PARTS, split  # noqa: E402


def save(fig: plt.Figure, folder: Path, name: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.png", folder / f"{name}.pdf"]
    fig.tight_layout()
    for p in paths:
        fig.savefig(p, dpi=150)
    plt.close(fig)
    return paths


def _legend(ax: plt.Axes, title: str) -> None:
    """Beside the plot, never over the data."""
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), title=title)


def per_category(rows: dict[str, pd.DataFrame], by: str, title: str) -> plt.Figure:
    """Grouped bars of τ (top) and speedup (bottom, when a baseline exists) per `by` group and method.
    `rows` maps a method label to its `summarise` table."""
    speedups = any(t.speedup.notna().any() for t in rows.values())
    groups = list(dict.fromkeys(k for t in rows.values() for k in t[by]))
    fig, axes = plt.subplots(2 if speedups else 1, 1, figsize=(max(7.0, 1.0 * len(groups) + 4), 6.5 if speedups else 3.8),
                             squeeze=False)
    x = np.arange(len(groups))
    width = 0.8 / max(len(rows), 1)
    panels = [("tau", "τ (tokens per target forward)")] + ([("speedup", "speedup vs baseline (×)")] if speedups else [])
    for ax, (metric, ylabel) in zip(axes[:, 0], panels):
        for i, (label, table) in enumerate(rows.items()):
            values = table.set_index(by)[metric].reindex(groups)
            ax.bar(x + (i - (len(rows) - 1) / 2) * width, values, width, label=label, color=f"C{i}")
        if metric == "speedup":
            ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(x, groups, rotation=30, ha="right")
        ax.set_ylabel(ylabel)
        ax.set_xlabel(by)
    axes[0, 0].set_title(title)
    _legend(axes[0, 0], "method")
    return fig


def tau_along_response(series: dict[str, pd.DataFrame], window: int = 8) -> plt.Figure:
    """Mean tokens per round at each round index of a turn, smoothed over `window` rounds (WhiFlash Fig. 2).
    `series` maps a method label to its rounds table."""
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for label, rounds in series.items():
        per_round = (rounds.accepted + 1).groupby(rounds["round"]).mean()
        ax.plot(per_round.index, per_round.rolling(window, min_periods=1).mean(), label=label)
    ax.set_xlabel("round index within a turn")
    ax.set_ylabel("tokens per round")
    ax.set_title(f"Acceptance along the response (mean over turns, {window}-round moving average)")
    _legend(ax, "method")
    return fig


def phase_bars(series: dict[str, pd.DataFrame], clock: str) -> plt.Figure:
    """Stacked mean ms per round by phase for each method."""
    labels = list(series)
    means = pd.DataFrame({label: split(rounds).mean() for label, rounds in series.items()}).T
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(labels) + 2), 4))
    bottom = np.zeros(len(labels))
    for part in PARTS:
        if means[part].abs().sum() > 0:
            ax.bar(labels, means[part], bottom=bottom, label=part)
            bottom += means[part].to_numpy()
    ax.set_ylabel("ms per round (mean)")
    ax.set_xlabel("method")
    ax.set_title(f"Where a round's time goes ({clock} clock)")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    _legend(ax, "phase")
    return fig


def survival_curves(series: dict[str, pd.DataFrame]) -> plt.Figure:
    """P(acceptance length ≥ n) per method (ConFu Fig. 5); acceptance length includes the bonus token."""
    fig, ax = plt.subplots(figsize=(8.5, 3.8))
    for label, rounds in series.items():
        s = survival(rounds)
        ax.step(s.length, s.share, where="post", marker="o", markersize=3, label=label)
    ax.set_xlabel("acceptance length n (tokens per round, bonus included)")
    ax.set_ylabel("share of rounds with length ≥ n")
    ax.set_ylim(0, 1.02)
    ax.set_title("Acceptance-length survival")
    _legend(ax, "method")
    return fig



def head_bars(frame: pd.DataFrame, clock: str) -> plt.Figure:
    """Mean ms (bar) and p95 (whisker) of the head alone and a whole draft step, dense vs FlashHead."""
    components = list(dict.fromkeys(frame.component))
    variants = list(dict.fromkeys(frame.variant))
    fig, ax = plt.subplots(figsize=(7, 3.8))
    x = np.arange(len(components))
    width = 0.8 / len(variants)
    for i, variant in enumerate(variants):
        rows = frame[frame.variant == variant].set_index("component").reindex(components)
        ax.bar(x + (i - (len(variants) - 1) / 2) * width, rows.mean_ms, width, label=variant, color=f"C{i}",
               yerr=[[0] * len(rows), rows.p95_ms - rows.mean_ms], capsize=4)
    ax.set_xticks(x, components)
    ax.set_ylabel("ms per call (bar: mean, whisker: p95)")
    ax.set_title(f"Draft head cost ({clock} clock)")
    _legend(ax, "head")
    return fig


def threshold_sensitivity(sweep: pd.DataFrame, policy: str) -> plt.Figure:
    """Simulated decode tokens/s against the routing threshold, one line per category (WhiFlash Table 2)."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)  # Spec-Bench has 13 categories: 10 colours would repeat
    groups = sweep.groupby("category") if "category" in sweep else [("held-out", sweep)]
    for category, g in groups:
        ax.plot(g.threshold, g.tokens_per_s, marker="o", markersize=3, label=str(category))
    ax.set_xlabel(policy)
    ax.set_ylabel("simulated decode tokens/s")
    ax.set_title("Threshold sensitivity (trace replay + measured latencies)")
    _legend(ax, "category")
    return fig


def switching(frame: pd.DataFrame, clock: str) -> plt.Figure:
    """Catch-up cost of a switch as % of a round, against the base KV length, one line per backlog."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for backlog, g in frame.groupby("backlog"):
        ax.plot(g.kv_len, g.catchup_pct_of_round, marker="o", markersize=3, label=f"{backlog} tokens")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("base KV length (tokens)")
    ax.set_ylabel("catch-up cost (% of a round)")
    ax.set_title(f"Switching cost: lazy KV-only catch-up of EAGLE-3 ({clock} clock)")
    _legend(ax, "backlog")
    return fig
