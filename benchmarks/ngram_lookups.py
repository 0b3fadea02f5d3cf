"""Benchmark: DART n-gram trie build, .trie save/load, and probability lookups per second.

    python benchmarks/ngram_lookups.py --tokens 300000 --vocab 32000

The corpus is Zipf-distributed token ids (natural text's shape); each lookup scores 25 candidate tokens
after a 2-token context, as one beam expansion of DART's search does.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from specbench_methods.ngram import Trie


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=300_000, help="corpus size in tokens (default 300000)")
    ap.add_argument("--vocab", type=int, default=32_000, help="vocabulary size (default 32000)")
    ap.add_argument("--lookups", type=int, default=20_000, help="probability calls to time (default 20000)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    corpus = np.minimum(rng.zipf(1.2, args.tokens), args.vocab - 1).astype(np.int64)
    docs = [corpus[i:i + 512].tolist() for i in range(0, len(corpus), 512)]

    t = time.perf_counter()
    trie = Trie.build(docs, order=3)
    build = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.trie"
        t = time.perf_counter()
        trie.save(path)
        save = time.perf_counter() - t
        t = time.perf_counter()
        trie = Trie.load(path)
        load = time.perf_counter() - t
        size = path.stat().st_size
    starts = rng.integers(0, len(corpus) - 2, args.lookups)
    candidates = np.minimum(rng.zipf(1.2, (args.lookups, 25)), args.vocab - 1)
    t = time.perf_counter()
    for s, cand in zip(starts, candidates):
        trie.probability(corpus[s:s + 2].tolist(), cand)
    per_s = args.lookups / (time.perf_counter() - t)
    print(f"nodes {len(trie.token):,}  file {size / 1e6:.1f} MB  build {build:.1f} s  save {save:.1f} s  load {load:.1f} s")
    print(f"lookups: {per_s:,.0f} probability calls/s (25 candidates each, context 2)")


if __name__ == "__main__":
    main()
