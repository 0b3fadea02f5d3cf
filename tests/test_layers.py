"""The layers point one way: every module of the package sits in one layer of `LAYERS`, and imports only modules
of its own layer or below (core imports nothing above it, methods only core, analysis no command...), and no
module imports itself back through others (no import circles, within a layer included)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imports(path: Path) -> set[str]:
    """Every module a file imports (relative imports resolved against its package), at any depth."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from package import module`
    return found


def ours(module: str) -> bool:
    return module.split(".")[0] in ("specbench_cli", "specbench_methods")


def test_core_imports_nothing_above_it() -> None:
    for path in sorted((ROOT / "specbench_cli" / "core").rglob("*.py")):
        above = [m for m in imports(path) if ours(m) and not m.startswith("specbench_cli.core")]
        assert not above, f"{path.name} (core) imports {above}"


def test_core_names_no_method() -> None:
    """The core's code and docstrings speak of proposers, routes and extras, never of a registered method:
    what one method needs goes through an extension point every method could use."""
    import re

    from specbench_cli.registry import METHODS

    names = {n for m in METHODS for n in (m, m.replace("-", "_"), *m.split("-"))} - {"hf", "generate", "neural", "freq"}
    names |= {"eagle-3", "eagle", "sps", "confu", "flashhead", "dflash", "dart", "whiflash", "hvd"}
    for path in sorted((ROOT / "specbench_cli" / "core").rglob("*.py")):
        text = path.read_text().lower()
        found = sorted(n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text))
        assert not found, f"core/{path.name} names {found}"


def test_methods_import_only_core() -> None:
    for path in sorted((ROOT / "methods").rglob("*.py")):
        above = [m for m in imports(path) if ours(m) and not m.startswith(("specbench_cli.core", "specbench_methods"))]
        assert not above, f"methods/{path.name} imports {above}"


def test_outside_references_do_not_import_the_loop() -> None:
    assert "specbench_cli.core.engine" not in imports(ROOT / "methods" / "hf_generate.py")


def test_the_walker_sees_imports() -> None:  # the checks above would pass vacuously on a blind walker
    assert "specbench_cli.core.tree" in imports(ROOT / "methods" / "eagle3" / "method.py")
    assert "specbench_cli.core.method" in imports(ROOT / "specbench_cli" / "core" / "engine.py")


def test_analysis_reads_records_and_imports_no_command() -> None:
    """analysis/ turns records into tables and figures; the commands (run, oracle, calibrate, train) sit above it."""
    commands = ("specbench_cli.cli", "specbench_cli.engines.specbench", "specbench_cli.commands.oracle", "specbench_cli.commands.calibrate",
                "specbench_cli.commands.train", "specbench_cli.commands.sweep", "specbench_cli.commands.profile", "specbench_cli.commands.tune.pricing",
                "specbench_cli.commands.tune.budget")
    for path in sorted((ROOT / "specbench_cli" / "analysis").glob("*.py")):
        above = [m for m in imports(path) if m.startswith(commands)]
        assert not above, f"analysis/{path.name} imports {above}"


def modules() -> dict[str, Path]:
    """Every module of the package and of methods/, by dotted name (a package by its own name)."""
    found = {}
    for path in [*(ROOT / "specbench_cli").rglob("*.py"), *(ROOT / "methods").rglob("*.py")]:
        parts = path.relative_to(ROOT).with_suffix("").parts
        parts = ("specbench_methods", *parts[1:]) if parts[0] == "methods" else parts  # installed under that name
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's import circles: its strongly connected parts of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def import_graph() -> dict[str, set[str]]:
    """Who imports whom among our modules, at any depth in a file (an import inside a function counts: it still
    makes the two modules need each other)."""
    known = modules()
    return {name: {m for m in imports(path) if m in known and m != name} for name, path in known.items()}


def test_no_module_imports_itself_back() -> None:
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_finder_finds_circles() -> None:  # the check above would pass vacuously on a blind finder
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    assert "specbench_cli.commands.tune.pricing" in graph["specbench_cli.commands.tune.budget"]  # `from specbench_cli.commands.tune import pricing as tuning`
    assert "specbench_cli.run_folder" in graph["specbench_cli.engines.specbench"]
    assert "specbench_methods.eagle3.network" in graph["specbench_methods.eagle3.method"]  # methods/ by its installed name


# The layers, bottom first: a module's layer is that of the longest prefix naming it. The pieces commands share sit
# in two layers: what needs no record of a run (settings, registries, the loader, the machine) and what runs one
# (the results folder's life, conversations, the greedy replay, the plan).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("specbench_cli.core",)),
    ("methods", ("specbench_methods",)),
    ("shared", ("specbench_cli", "specbench_cli.registry", "specbench_cli.models", "specbench_cli.resources",
                "specbench_cli.datasets", "specbench_cli.hub_datasets", "specbench_cli.options", "specbench_cli.folders",
                "specbench_cli.records", "specbench_cli.hardware", "specbench_cli.telemetry", "specbench_cli.progress",
                "specbench_cli.loading", "specbench_cli.random_weights", "specbench_cli.inputs", "specbench_cli.budgets")),
    ("analysis", ("specbench_cli.analysis",)),
    ("running", ("specbench_cli.run_folder", "specbench_cli.conversations", "specbench_cli.greedy_replay",
                 "specbench_cli.planning")),
    ("engines", ("specbench_cli.engines",)),
    ("commands", ("specbench_cli.commands",)),
    ("cli", ("specbench_cli.cli", "specbench_cli.__main__")),
]


def layer(module: str) -> int:
    """The index in LAYERS of the longest prefix that names `module` (a package's modules share its layer)."""
    best, found = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), i
    return found


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a module to one of a higher layer, as "importer -> imported"."""
    return sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps if layer(b) > layer(a))


def test_every_module_has_a_layer() -> None:
    """The package's top level is a list of layers: a new module is placed in one (a prefix in LAYERS)."""
    shared = dict(LAYERS)["shared"]
    loose = [m for m in modules() if layer(m) < 0 or (layer(m) == 2 and m.count(".") == 1 and m not in shared)]
    assert not loose, f"modules in no layer: {loose}"


def test_no_import_runs_up_a_layer() -> None:
    found = upward(import_graph())
    assert not found, "imports from a lower layer to a higher one: " + "; ".join(found)


def test_the_direction_check_sees_an_upward_import() -> None:  # the check above would pass vacuously otherwise
    assert upward({"specbench_cli.inputs": {"specbench_cli.engines.vllm_methods"}}) == [
        "specbench_cli.inputs -> specbench_cli.engines.vllm_methods"]
    assert not upward({"specbench_cli.commands.run": {"specbench_cli.inputs"}})
    assert layer("specbench_cli.commands.tune.batch") > layer("specbench_cli.engines.specbench") > layer(
        "specbench_cli.planning") > layer("specbench_cli.inputs") > layer("specbench_methods.eagle3.method") > layer(
        "specbench_cli.core.target")
