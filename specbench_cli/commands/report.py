"""What `specbench report` does: load the results, write every table (.md .csv .tex) and figure (.png .pdf),
print the terminal tables, and run the gates asked for (--compare, --expect), returning the lines of what failed."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from specbench_cli.core.errors import UsageError


def report(console: Console, results_dirs: list[Path], out: Path | None, overwrite: bool, compare: Path | None,
            max_regression: float, along: list[str] | None, plots: bool, classify: bool,
            expect: Path | None, export: tuple[str, Path] | None = None) -> tuple[list[str], list[str]]:
    """The report; returns (one line per regression or missed published value: the command exits 1 on any, one
    line per comparison the gate could not decide: exit 3 if nothing failed)."""
    from specbench_cli.analysis import report as rep
    from specbench_cli.core.errors import unknown
    from specbench_cli.inputs import at_least
    from specbench_cli.analysis.parity import load_expectations
    from specbench_cli.analysis.results import load

    at_least("--max-regression", max_regression, 0)
    from specbench_cli.analysis import exports

    if export is not None:
        exports.check_format(export[0])
        exports.check_destination(*export)
    folder = out or results_dirs[0] / "report"
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--out {folder} is a file; name a folder for the report")
    if folder.exists() and any(folder.iterdir()) and not overwrite:
        raise UsageError(f"report folder {folder} exists; pass --overwrite to replace it or --out for another")
    expectations = load_expectations(expect) if expect else []
    results = load(results_dirs)
    reference = load([compare]) if compare else None
    if reference is not None:
        from specbench_cli.analysis.gate import check_comparable, key

        now = {key(g): g for g in results.groups}
        for ref in reference.groups:  # settings that differ: one line before any table is written
            if key(ref) in now:
                check_comparable(now[key(ref)], ref)
    if export is not None:
        exports.check_exportable(results, export[0])
    labels = [g.label for g in results.groups]
    for label in along or []:
        if label not in labels:
            raise unknown("method label for --along", label, labels)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create report folder {folder}: {err.strerror}") from None
    from specbench_cli.analysis.divergence import run_classifier

    tables = rep.all_tables(results, run_classifier() if classify else None)
    for table in tables:
        if table.terminal:
            console.print(table.rich())
        table.write(folder)
    written = rep.figures(results, folder, along) if plots else []
    console.print(f"wrote {len(tables)} tables (.md .csv .tex) and {len(written) // 2} figures (.png .pdf) to {folder}")
    if export is not None:
        files = exports.export(results, *export)
        console.print(f"exported {len(files)} {export[0]} file(s) to {export[1]}", highlight=False)
        for line in exports.speed_py_notes(results) if export[0] == "spec-bench" else []:
            console.print(line, highlight=False, soft_wrap=True)
    problems: list[str] = []
    undecided: list[str] = []
    if reference is not None:
        problems, undecided = gate(console, results, reference, max_regression, tables, folder, compare)
    if expectations:
        problems += parity(results, expectations, folder, console)
    return problems, undecided


def gate(console: Console, results, reference, max_regression: float, tables: list, folder: Path,
         compare: Path) -> tuple[list[str], list[str]]:
    """--compare: outputs and τ exactly, speed against its noise (`analysis/gate.py`); its table in the
    terminal and the report folder."""
    from specbench_cli.analysis import gate as regression_gate

    named = {t.name: t for t in tables}
    verdict = regression_gate.compare(results, reference, max_regression, named.get("lossless"), named.get("replay"))
    table = regression_gate.table(verdict, max_regression)
    if len(table.frame):
        console.print(table.rich())
        table.write(folder)
    for line in (*verdict.passed, *verdict.notes):
        console.print(line, highlight=False, soft_wrap=True)
    if not verdict.failed and not verdict.inconclusive:
        console.print(f"no regression beyond {max_regression:g}% against {compare}")
    return [f"regression: {line}" for line in verdict.failed], [f"inconclusive: {line}" for line in verdict.inconclusive]


def parity(results, expectations, folder: Path, console: Console) -> list[str]:
    """--expect: the parity table (terminal and files) and a line per expectation missed or missing."""
    from specbench_cli.analysis.parity import check

    table, problems = check(results, expectations)
    console.print(table.rich())
    table.write(folder)
    if not problems:
        console.print(f"all {len(expectations)} published values reproduced within their tolerances")
    return [f"parity: {line}" for line in problems]
