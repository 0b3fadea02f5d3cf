"""Every round's draft tree of some methods on a few spec-bench prompts, for a before/after check of a change that
must not alter what a drafter drafts (a refactor of the loop or of the proposers).

    .venv/bin/python scripts/draft_trees.py /tmp/before-trees.json
    .venv/bin/python scripts/draft_trees.py /tmp/after-trees.json --compare /tmp/before-trees.json

Runs `specbench run --dataset spec-bench --limit 3 --max-new-tokens 48` (float32 by default, `--dtype`; on the
CPU with the embedded model) in this process for each method, recording the tokens and parents of every tree the loop
accepts on (`core.acceptance.accept`, seen through each core module that imports it). `--compare` exits 1 naming
every method whose trees differ and its first differing round.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

METHODS = ("eagle3", "dflash", "dart")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed copy's


def record(method: str, dtype: str) -> list[list[list[int]]]:
    """The trees `method` drafted, in the order the loop accepted on them: [tokens, parents] each."""
    import specbench_cli.core as core
    from specbench_cli.cli import app
    from specbench_cli.core import acceptance

    trees: list[list[list[int]]] = []
    real = acceptance.accept

    def logged(tree, *args, **kwargs):
        trees.append([list(tree.tokens), list(tree.parents)])
        return real(tree, *args, **kwargs)

    modules = [m for name, m in sys.modules.items() if name.startswith(core.__name__ + ".")]
    patched = [m for m in modules if getattr(m, "accept", None) is real]
    for m in patched:
        m.accept = logged
    try:
        with tempfile.TemporaryDirectory() as scratch:
            app(["run", "--method", method, "--dataset", "spec-bench", "--limit", "3", "--max-new-tokens", "48",
                 "--threads", "2", "--dtype", dtype, "--out", f"{scratch}/run"],
                standalone_mode=False)
    finally:
        for m in patched:
            m.accept = real
    return trees


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--compare", type=Path, help="an earlier file of trees; exit 1 on any difference")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    import specbench_cli.core.engine  # noqa: F401  (the loop's modules, so their `accept` can be seen)
    import specbench_cli.engines.specbench  # noqa: F401

    trees = {m: record(m, args.dtype) for m in args.methods.split(",")}
    args.out.write_text(json.dumps(trees))
    for m, t in trees.items():
        print(f"{m}: {len(t)} trees, {sum(len(x[0]) for x in t)} nodes")
    if args.compare:
        before = json.loads(args.compare.read_text())
        changed = []
        for m, t in trees.items():
            old = before.get(m, [])
            if old != t:
                first = next((i for i, (a, b) in enumerate(zip(old, t)) if a != b), min(len(old), len(t)))
                changed.append(f"{m} (round {first})")
        print("identical" if not changed else f"changed: {', '.join(changed)}")
        sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
