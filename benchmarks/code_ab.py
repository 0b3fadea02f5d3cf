"""Interleaved A/B of two code trees: alternate `specbench run` of one method in tree A and tree B, `reps` times
each (order ABBA...), and report B/A of total decode tokens / total decode time with a bootstrap interval over
the paired reps. Clock: the runs' own (perf_counter on CPU)."""
import os, random, subprocess, sys, statistics, tempfile
from pathlib import Path
import pandas as pd

a, b, method, dtype, reps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
extra = sys.argv[6:]
out = Path("/tmp/specbench-code-ab") / f"{method}-{dtype}"
out.mkdir(parents=True, exist_ok=True)

def tree_env(tree: str) -> dict[str, str]:
    """The tree's methods/ under its installed name, ahead of the editable install's (which points at one checkout)."""
    shim = Path(tempfile.mkdtemp(prefix="code-ab-"))
    (shim / "specbench_methods").symlink_to(Path(tree).resolve() / "methods")
    return {**os.environ, "PYTHONPATH": f"{shim}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

ENV = {a: tree_env(a), b: tree_env(b)}

def once(tree: str, tag: str) -> float:
    folder = out / tag
    subprocess.run([sys.executable, "-m", "specbench_cli", "run", "--method", method, "--dataset",
                    "spec-bench", "--limit", "6", "--max-new-tokens", "64", "--threads", "2", "--dtype", dtype,
                    "--no-replay", "--out", str(folder), *extra], cwd=tree, env=ENV[tree], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    t = pd.read_parquet(folder / "prompts.parquet")
    return t.decode_tokens.sum() / (t.decode_ms.sum() / 1000)

pairs = []
for r in range(reps):
    order = [("A", a), ("B", b)] if r % 2 == 0 else [("B", b), ("A", a)]
    got = {name: once(tree, f"{name}{r}") for name, tree in order}
    pairs.append((got["A"], got["B"]))
    print(f"rep {r}: A {got['A']:.2f} tok/s  B {got['B']:.2f} tok/s  B/A {got['B'] / got['A']:.3f}", flush=True)
ratios = [y / x for x, y in pairs]
rng = random.Random(0)
boots = sorted(statistics.mean(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
print(f"{method} {dtype}: B/A mean {statistics.mean(ratios):.3f} [{boots[50]:.3f}, {boots[1949]:.3f}] (95% bootstrap, {reps} paired reps)")
