"""The one progress bar layout every command shows, and the bar of a run's recorded prompts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specbench_cli.datasets import Prompt


def progress_bar(console: Console, remaining: bool = True) -> Progress:
    """The one rich progress bar layout (description, bar, n/total, live stats, elapsed and, unless the caller
    estimates it itself, rich's time remaining)."""
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[stats]}"), TimeElapsedColumn()]
    return Progress(*columns, *([TimeRemainingColumn()] if remaining else []), console=console)


@contextmanager
def record_progress(console: Console, total: int, todo: list[tuple[int, Prompt]],
                    label: str) -> Iterator[Callable[[Prompt, str], None]]:
    """The progress bar of a run's recorded prompts (`total` in the selection, `todo` still to decode); yields
    `advance(prompt, stats)`, called as each finishes.

    The bar's time estimate counts turns, not prompts (prompts differ in turns and length): turns left x the
    mean wall time of a turn so far."""
    turns_left, turns_done = sum(len(p.turns) for _, p in todo), 0
    with progress_bar(console, remaining=False) as bar:
        task = bar.add_task(label, total=total, completed=total - len(todo), stats="")
        started = time.perf_counter()

        def advance(prompt: Prompt, stats: str) -> None:
            nonlocal turns_done
            turns_done += len(prompt.turns)
            left = (turns_left - turns_done) * (time.perf_counter() - started) / turns_done
            bar.update(task, advance=1, stats=f"{stats}  ~{_clock(left)} left".strip())

        yield advance


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"
