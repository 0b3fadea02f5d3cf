"""What `run --list` and `sweep --list` show: the methods, models and datasets, and a sweep's jobs, as tables on a
wide terminal and as plain lists where a table would cut ids."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def show_jobs(console: Console, grid, shards: int | None) -> None:
    """A sweep's jobs: shard, hash, directory, options and status."""
    from specbench_cli.commands.sweep import status

    n = shards or len(grid.jobs)
    t = Table(title=f"{len(grid.jobs)} jobs under {grid.out}")
    for column in ("shard", "hash", "directory", "options", "status"):
        t.add_column(column, overflow="fold")
    for i, job in enumerate(grid.jobs):
        t.add_row(f"{i % n}/{n}", job.hash, job.name(), " ".join(f"{k}={v}" for k, v in job.options) or "—",
                  status(job, grid.out))
    console.print(t)


def show_lists(console: Console) -> None:
    """Methods, models and datasets: tables on a wide terminal, a plain list where a table would cut ids."""
    from specbench_cli.options import default_texts, options_record
    from specbench_cli.datasets import dataset_rows
    from specbench_cli.models import MODELS, get_model_spec, random_architectures
    from specbench_cli.registry import METHODS, method_class

    methods = []
    for name, entry in METHODS.items():
        cls, about = method_class(name), entry.about
        shown = default_texts(cls.Options)
        opts = " ".join(f"{k}={v}" + (f" ({shown[k]})" if k in shown else "")
                        for k, v in options_record(cls.Options()).items()) or "—"
        drafters = " ".join([*cls.drafter_names, *(f"({d}, optional)" for d in cls.optional_drafters)]) or "—"
        methods.append((name, about, drafters, opts))
    models = [(m.name, m.target, "\n".join(f"{k}: {v}" for k, v in m.drafters.items()) or "—", m.about)
              for m in map(get_model_spec, MODELS)]
    sections = (("methods", ("name", "what", "--drafter names", "--opt defaults"), methods),
                ("models", ("name", "target", "registered drafters", "about"), models),
                ("datasets", ("name", "source", "revision", "prompts", "categories", "licence", "here?"), dataset_rows()))
    for title, columns, rows in sections:
        show_section(console, title, columns, rows)
    console.print(f"random weights of a model's architecture, no download: --target random:NAME[:SEED] for "
                  f"{', '.join(random_architectures())}", highlight=False, soft_wrap=True)


def show_section(console: Console, title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    if console.width >= 120:
        t = Table(title=title)
        for column in columns:
            t.add_column(column, overflow="fold")
        for row in rows:
            t.add_row(*row)
        console.print(t)
        return
    console.print(f"{title}:", style="bold")
    for row in rows:
        console.print(f"  {row[0]}", style="bold", highlight=False, markup=False)
        for column, value in zip(columns[1:], row[1:]):
            console.print(f"    {column}: " + value.replace("\n", "; "), highlight=False, soft_wrap=True, markup=False)
