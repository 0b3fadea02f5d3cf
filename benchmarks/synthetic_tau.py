"""Check `--acceptance` by counting, not timing: an EAGLE-3 chain of 4 drafts at `synthetic:RATE` must emit
1 + r + r^2 + r^3 + r^4 tokens a round on average, and the run's own `speculation_profile.json` (report --export
specdec-bench) given back as `profile:FILE` must reproduce the run's τ. Any machine, any load: only the counts
matter. Writes a record (command, commit, machine, date, numbers) with --record.

    python benchmarks/synthetic_tau.py [--rate 0.7] [--limit 8] [--record benchmarks/results/synthetic-acceptance/X.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

CHAIN = ["--opt", "top_k=1", "--opt", "depth=3", "--opt", "total_token=5"]  # EAGLE-3 drafting 4 tokens a round


def specbench(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "specbench_cli", *args], check=True, stdout=subprocess.DEVNULL)


def run(out: Path, acceptance: str, a: argparse.Namespace) -> dict:
    """One run on the random target; its rounds' τ (emitted tokens over rounds, cut turns' last rounds kept)."""
    specbench("run", "--target", a.target, "--method", "eagle3", *CHAIN, "--acceptance", acceptance,
              "--limit", str(a.limit), "--max-new-tokens", str(a.max_new_tokens), "--warmup", "0",
              "--threads", str(a.threads), "--seed", str(a.seed), "--out", str(out))
    rounds = pd.read_parquet(out / "rounds.parquet")
    full = rounds[rounds.draft_depth == 4]  # rounds whose budget was not cut by the turn's end
    return {"rounds": len(rounds), "full_rounds": len(full), "tau": float(rounds.emitted.sum() / len(rounds)),
            "tau_full_rounds": float((full.accepted + 1).mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=0.7)
    ap.add_argument("--target", default="random:smollm2-135m")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--record", type=Path, default=None, help="write the record here (JSON)")
    a = ap.parse_args()
    expected = sum(a.rate ** k for k in range(5))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        synthetic = run(root / "synthetic", f"synthetic:{a.rate}", a)
        specbench("report", str(root / "synthetic"), "--no-plots", "--no-classify", "--out", str(root / "report"),
                  "--export", "specdec-bench", str(root / "export"))
        profile = next((root / "export").rglob("speculation_profile.json"))
        rates = json.loads(profile.read_text())["conditional_accept_rates"]
        replayed = run(root / "profile", f"profile:{profile}", a)
    checks = {"synthetic_vs_formula": synthetic["tau_full_rounds"] / expected - 1,
              "profile_vs_synthetic": replayed["tau"] / synthetic["tau"] - 1}
    for name, off in checks.items():
        print(f"{name}: {off:+.2%} ({'within' if abs(off) <= 0.03 else 'OUTSIDE'} 3 %)")
    print(f"synthetic:{a.rate}: τ {synthetic['tau_full_rounds']:.3f} over {synthetic['full_rounds']} full rounds "
          f"(expected {expected:.3f}); profile {['%.3f' % r for r in rates]}: τ {replayed['tau']:.3f} against "
          f"{synthetic['tau']:.3f} over all {replayed['rounds']} / {synthetic['rounds']} rounds")
    if a.record:
        from specbench_cli.hardware import cpu_model, git_commit

        a.record.parent.mkdir(parents=True, exist_ok=True)
        a.record.write_text(json.dumps({
            "what": "--acceptance checked by counting: EAGLE-3 chain of 4 at synthetic:RATE, then its own exported "
                    "speculation_profile.json as profile:FILE (benchmarks/synthetic_tau.py)",
            "command": "python " + " ".join(sys.argv), "commit": (git_commit() or "")[:10],
            "machine": f"{cpu_model()}, {a.threads} thread(s)",
            "date": dt.date.today().isoformat(), "rate": a.rate, "expected_tau": expected, "synthetic": synthetic,
            "profile_rates": rates, "profile": replayed, "relative_differences": checks}, indent=1) + "\n")


if __name__ == "__main__":
    main()
