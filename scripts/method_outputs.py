"""Every registered method's output ids and per-turn τ on a small spec-bench selection, for a before/after check
of a change that must not alter behaviour (a large move, a refactor of the loop or the records).

    .venv/bin/python scripts/method_outputs.py /tmp/before.json            # run every method, write the digest
    .venv/bin/python scripts/method_outputs.py /tmp/after.json --compare /tmp/before.json

Each method runs as `specbench run --dataset spec-bench --limit 4 --max-new-tokens 32 --threads 2 --dtype D
--paper-budget` (CPU, the embedded model, every method at its paper's budget, EAGLE-3's tree included; D float32
unless `--dtype` says otherwise, `--batch-size B` for a batched run, whose methods must all batch) into a scratch
folder beside the digest; the digest holds, per method, per prompt and turn, the output ids and τ. `--compare`
exits 1 naming every method whose ids or τ differ.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

METHODS = ("baseline", "hf-generate", "suffix", "pld", "eagle3", "dflash", "dart", "confu", "sps", "flashhead",
           "whiflash-entropy", "whiflash-neural", "hvd", "hvd-freq")


def run(method: str, out: Path, dtype: str, batch_size: int) -> dict:
    batch = ["--batch-size", str(batch_size)] if batch_size > 1 else []
    subprocess.run([sys.executable, "-m", "specbench_cli", "run", "--method", method, "--dataset", "spec-bench",
                    "--limit", "4", "--max-new-tokens", "32", "--threads", "2", "--dtype", dtype, *batch,
                    "--paper-budget", "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    prompts = pd.read_parquet(out / "prompts.parquet").sort_values(["index", "turn"])
    return {f"{r.prompt_id}/{r.turn}": {"ids": [int(t) for t in r.output_ids], "tau": round(float(r.tau), 9)}
            for r in prompts.itertuples()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("digest", type=Path)
    parser.add_argument("--compare", type=Path, help="an earlier digest; exit 1 on any difference")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or auto (run's default)")
    parser.add_argument("--batch-size", type=int, default=1)
    args = parser.parse_args()
    scratch = args.digest.with_suffix(".runs")
    if scratch.exists():
        sys.exit(f"{scratch} exists; remove it or name another digest")
    digest = {}
    for method in args.methods.split(","):
        digest[method] = run(method, scratch / method, args.dtype, args.batch_size)
        print(f"{method}: {len(digest[method])} turns", flush=True)
    args.digest.write_text(json.dumps(digest, indent=1))
    if args.compare:
        before = json.loads(args.compare.read_text())
        changed = [m for m in digest if before.get(m) != digest[m]]
        print("identical" if not changed else f"changed: {', '.join(changed)}")
        sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
