"""The report's figures, each saved as PNG and PDF, with labelled axes, units and a legend, so they read
without the code: speedup and τ per category, τ along a response, phase breakdown, acceptance survival."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from specbench_cli.analysis.metrics import along_response, histogram, survival  # noqa: E402
from specbench_cli.analysis.phases import PARTS, split  # noqa: E402


def save(fig: plt.Figure, folder: Path, name: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.png", folder / f"{name}.pdf"]
    fig.tight_layout()
    for p in paths:
        fig.savefig(p, dpi=150)
    plt.close(fig)
    return paths


def colour(i: int, n: int) -> tuple:
    """The i-th of n series' colour: tab10 up to 10 series, tab20 up to 20, so no two methods share one
    (matplotlib's default cycle repeats after 10, which made two methods look like one)."""
    return (plt.cm.tab10 if n <= 10 else plt.cm.tab20)(i % (10 if n <= 10 else 20))


LABELLED = 6  # bar values are printed up to this many series per group; beyond, they overlap (see the tables)
LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "pad": 0.3, "alpha": 0.8}  # a value stays legible over the 1.0 line


def _legend(ax: plt.Axes, title: str | None) -> None:
    """Beside the plot, never over the data."""
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), title=title)


def per_category(rows: dict[str, pd.DataFrame], by: str, dataset: str) -> plt.Figure:
    """Grouped bars of τ (top) and speedup (bottom) per `by` group and method, each bar labelled with its
    value (up to LABELLED methods), each group with its prompt count, and `overall` set apart at the right. Speedup needs a baseline
    run of the same settings; without one the figure draws τ alone and says so. `rows` maps a method label
    to its `summarise` table."""
    speedups = any(t.speedup.notna().any() for t in rows.values())
    groups = [g for g in dict.fromkeys(k for t in rows.values() for k in t[by]) if g != "overall"] + ["overall"]
    counts = pd.concat([t.set_index(by).prompts for t in rows.values()], axis=1).max(axis=1)
    per_group = max(1.1, 0.3 * len(rows) + 0.4)
    fig, axes = plt.subplots(2 if speedups else 1, 1, figsize=(min(18.0, max(7.0, per_group * len(groups) + 4)), 7 if speedups else 4.2),
                             squeeze=False)
    x = np.arange(len(groups)) + np.where(np.array(groups) == "overall", 0.5, 0.0)  # a gap before overall
    width = 0.8 / max(len(rows), 1)
    panels = [("tau", "τ (tokens per target forward)")] + ([("speedup", "speedup vs baseline (×)")] if speedups else [])
    for ax, (metric, ylabel) in zip(axes[:, 0], panels):
        for i, (label, table) in enumerate(rows.items()):
            values = table.set_index(by)[metric].reindex(groups)
            bars = ax.bar(x + (i - (len(rows) - 1) / 2) * width, values, width, label=label, color=colour(i, len(rows)))
            if len(rows) <= LABELLED:
                ax.bar_label(bars, labels=[f"{v:.2f}" if v == v else "" for v in values], fontsize="x-small", padding=1,
                             bbox=LABEL_BOX)
        if metric == "speedup":
            ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.axvline(x[-1] - 0.75, color="grey", linewidth=0.8)
        ax.set_xticks(x, [f"{g}\n(n={int(counts.get(g, 0))})" for g in groups], rotation=30, ha="right")
        ax.set_ylabel(ylabel)
        ax.set_xlabel(f"{by} (n = prompts)")
        ax.margins(y=0.12)
    axes[0, 0].set_title(f"{dataset}: τ and speedup per {by}" if speedups else
                         f"{dataset}: τ per {by} (no speedup: no baseline run with the same settings)")
    _legend(axes[0, 0], "method")
    return fig


def tau_along_response(series: dict[str, pd.DataFrame], bin_tokens: int = 16, min_share: float = 0.25) -> plt.Figure:
    """Tokens per round against the position in the response (tokens already emitted in the turn, so methods
    with different τ line up; WhiFlash Fig. 2). Each turn's rounds are averaged per `bin_tokens`-token bin;
    the line is the mean over turns, the band their 25-75% spread, and the lower panel the turns that reach
    each bin. Bins reached by fewer than `min_share` of the turns are cut: their mean is a few turns'.
    `series` maps a method label to its rounds table."""
    fig, (ax, count_ax) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for i, (label, rounds) in enumerate(series.items()):
        stats = along_response(rounds, bin_tokens, min_share)
        c = colour(i, len(series))
        ax.plot(stats.index, stats["mean"], color=c, label=label)
        ax.fill_between(stats.index, stats.q25, stats.q75, color=c, alpha=0.2, linewidth=0)
        count_ax.plot(stats.index, stats.n, color=c, drawstyle="steps-mid")
    ax.set_ylabel("tokens per round")
    ax.set_title(f"Acceptance along the response (mean over turns, band 25-75%; {bin_tokens}-token bins, "
                 f"cut below {min_share:.0%} of turns)", fontsize="medium")
    count_ax.set_ylabel("turns (n)")
    count_ax.set_xlabel("position in the response (tokens emitted before the round)")
    count_ax.set_ylim(bottom=0)
    _legend(ax, "method")
    return fig




def phase_bars(series: dict[str, pd.DataFrame], clock: str) -> plt.Figure:
    """Left: stacked mean ms per round by phase for each method. Right: each phase's share of the round on a
    log scale, so the small phases stay readable next to a verify that takes nearly all of it."""
    labels = list(series)
    means = pd.DataFrame({label: split(rounds).mean() for label, rounds in series.items()}).T
    parts = [p for p in PARTS if means[p].abs().sum() > 0]
    fig, (ax, share_ax) = plt.subplots(1, 2, figsize=(min(18.0, max(11.0, 0.6 * len(labels) + 9)), 4.4))
    bottom = np.zeros(len(labels))
    for j, part in enumerate(parts):
        ax.bar(labels, means[part], bottom=bottom, label=part, color=colour(j, len(parts)))
        bottom += means[part].to_numpy()
    ax.set_ylabel("ms per round (mean)")
    ax.set_xlabel("method")
    ax.set_title(f"Where a round's time goes ({clock} clock)", fontsize="medium")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    shares = 100 * means[parts].div(means["round"].replace(0, np.nan), axis=0)
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        xs = np.arange(len(parts)) + (i - (len(labels) - 1) / 2) * width
        share_ax.bar(xs, shares.loc[label].where(shares.loc[label] > 0), width, color=colour(i, len(labels)), label=label,
                     hatch="//", edgecolor="white")  # hatched: these colours are methods, the left panel's phases
    share_ax.set_yscale("log")
    share_ax.set_xticks(range(len(parts)), parts, rotation=30, ha="right")
    share_ax.set_ylabel("share of the round (%, log scale)")
    share_ax.set_title("Share of each phase", fontsize="medium")
    _legend(ax, "phase")
    _legend(share_ax, "method")
    return fig


def survival_curves(series: dict[str, pd.DataFrame]) -> plt.Figure:
    """P(acceptance length ≥ n) per method (ConFu Fig. 5); acceptance length includes the bonus token. The x
    axis ends where every method's share has fallen below 1% (the tail of rare long acceptances is noted)."""
    fig, ax = plt.subplots(figsize=(8.5, 3.8))
    longest = top = 1
    for i, (label, rounds) in enumerate(series.items()):
        s = survival(rounds)
        ax.step(s.length, s.share, where="post", marker="o", markersize=3, label=label, color=colour(i, len(series)))
        longest = max(longest, int(s.length.max()) if len(s) else 1)
        top = max(top, int(s.length[s.share >= 0.01].max()) if (s.share >= 0.01).any() else 1)
    ax.set_xlim(0.5, top + 1.5)
    ax.set_xlabel("acceptance length n (tokens per round, bonus included)"
                  + (f"; shown to {top + 1} of {longest} (beyond, < 1% of rounds)" if longest > top + 1 else ""))
    ax.set_ylabel("share of rounds with length ≥ n")
    ax.set_ylim(0, 1.02)
    ax.set_title("Acceptance-length survival")
    _legend(ax, "method")
    return fig


def length_histogram(series: dict[str, pd.DataFrame], longest: int = 16) -> plt.Figure:
    """% of rounds emitting exactly n tokens (accepted + bonus) per method, lengths past `longest` pooled."""
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.8 / max(len(series), 1)
    top = 1
    for i, (label, rounds) in enumerate(series.items()):
        h = histogram(rounds).set_index("length").share * 100
        shown = h[h.index <= longest].copy()
        if h.index.max() > longest:
            shown.loc[longest + 1] = h[h.index > longest].sum()
        ax.bar(shown.index + (i - (len(series) - 1) / 2) * width, shown, width, label=label, color=colour(i, len(series)))
        top = max(top, int(shown.index.max()))
    ticks = list(range(1, top + 1))
    ax.set_xticks(ticks, [str(n) if n <= longest else f">{longest}" for n in ticks])
    ax.set_xlabel("acceptance length n (tokens per round, bonus included)")
    ax.set_ylabel("% of rounds")
    ax.set_title("Acceptance-length histogram")
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


# x-axis labels of the threshold-sensitivity plots, per routed method
THRESHOLD_AXIS = {"whiflash-entropy": "entropy threshold (nats): EAGLE-3 above it, DFlash below",
                  "whiflash-neural": "ΔAL threshold: EAGLE-3 above it, DFlash below",
                  "hvd": "payoff threshold (predicted accepted length ŷ): cache draft at or above it, EAGLE-3 below"}


def threshold_sensitivity(sweep: pd.DataFrame, method: str) -> plt.Figure:
    """Simulated decode tokens/s against the routing threshold, one line per category (WhiFlash Table 2)."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)  # Spec-Bench has 13 categories: 10 colours would repeat
    groups = sweep.groupby("category") if "category" in sweep else [("held-out", sweep)]
    for category, g in groups:
        ax.plot(g.threshold, g.tokens_per_s, marker="o", markersize=3, label=str(category))
    ax.set_xlabel(THRESHOLD_AXIS.get(method, "threshold"))
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


def tune_candidates(frame: pd.DataFrame, title: str) -> plt.Figure:
    """`specbench tune`: each candidate budget's predicted speedup (bars) and, where it was run live, the measured
    one (points, with their 95 % interval where known), against the baseline's 1×."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    x = np.arange(len(frame))
    ax.bar(x, frame.speedup, color="#9ecae1", label="predicted")
    live = frame.measured_speedup.notna().to_numpy()
    measured = frame.measured_speedup[live].to_numpy()
    spread = None
    if "measured_low" in frame:
        spread = np.vstack([measured - frame.measured_low[live].to_numpy(), frame.measured_high[live].to_numpy() - measured])
    ax.errorbar(x[live], measured, yerr=spread, fmt="o", color="#d62728", capsize=3,
                label="measured (95% interval)" if spread is not None else "measured")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(x, [c.replace(" ", "\n") for c in frame.candidate], fontsize=7)
    ax.set_ylabel("speedup over the baseline")
    ax.set_title(title)
    _legend(ax, None)
    return fig


def against_load(series: dict[str, pd.DataFrame], level: str, unit: str, context: str = "") -> plt.Figure:
    """Throughput, speedup over the same level's baseline, and τ against the load (DART Tables 6-7 as curves):
    one line per method, the load on a log2 axis, throughput and speedup with their 95 % intervals as bars."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (("throughput", "output tokens/s (all requests)"), ("speedup", "speedup over the baseline (×)"),
              ("tau", "τ (mean acceptance length)"))
    for i, (label, frame) in enumerate(series.items()):
        for ax, (column, _) in zip(axes, panels):
            shown = frame.dropna(subset=[column])
            if len(shown) and not (column != "throughput" and label.split(":")[-1] == "baseline"):
                ax.plot(shown[level], shown[column], marker="o", label=label, color=colour(i, len(series)))
                if f"{column}_low" in shown:  # the 95 % interval as error bars
                    ax.errorbar(shown[level], shown[column], yerr=[(shown[column] - shown[f"{column}_low"]).clip(0),
                                                                   (shown[f"{column}_high"] - shown[column]).clip(0)],
                                fmt="none", ecolor=colour(i, len(series)), capsize=3, linewidth=1)
    levels = sorted({n for frame in series.values() for n in frame[level]})
    for ax, (column, name) in zip(axes, panels):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(n) for n in levels])
        ax.set_xlabel(f"{level.replace('_', ' ')} ({unit})")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[1].axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    fig.suptitle(f"Throughput, speedup and τ against {level.replace('_', ' ')}" + (f" ({context})" if context else ""))
    handles, labels = axes[0].get_legend_handles_labels()
    axes[-1].legend(handles, labels, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), title="method")
    return fig
