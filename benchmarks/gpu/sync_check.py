"""Every method's host reads of device values a round, counted by `core.host_reads` on any device, and on CUDA beside
the synchronisations the device's own sync-debug mode reports (which also sees host uploads and waits inside
libraries): does the CPU's count name every wait a GPU round has? One turn of one prompt per method, the embedded
model and its drafters, at each method's defaults. tests/test_host_reads.py pins the CPU counts.

    python benchmarks/gpu/sync_check.py --device cuda --dtype bfloat16     # a stage of check.sh
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specbench_cli.core.engine import decode_turn  # noqa: E402
from specbench_cli.core.host_reads import HostReads, Round, per_round  # noqa: E402
from specbench_cli.core.method import networks  # noqa: E402
from specbench_cli.core.target import Target  # noqa: E402
from specbench_cli.core.turn import DecodeSettings  # noqa: E402
from specbench_cli.loading import load_model, resolve_dtype  # noqa: E402
from specbench_cli.models import get_model_spec  # noqa: E402
from specbench_cli.registry import method_class  # noqa: E402

ROUND_METHODS = ("baseline", "suffix", "pld", "eagle3", "dflash", "dart", "confu", "sps", "flashhead",
                 "whiflash-entropy", "whiflash-neural", "hvd", "hvd-freq")  # hf-generate runs its own loop


def method_rounds(name: str, loaded, prompt: list[int], new: int) -> list[Round]:
    """One greedy turn of method `name` at its defaults on the loaded embedded target: its rounds' reads (the
    counter active over the whole turn, so values a proposer keeps from its prefill count as device values). A
    network that stays on the host whatever the device (`on_host`: HVD's payoff predictor) is not a device root."""
    cls = method_class(name)
    method = cls(cls.Options(), loaded, get_model_spec("smollm2-135m").drafters)
    modules = [loaded.model, *(m for m in networks(method) if not getattr(m, "on_host", False))]
    reads = HostReads([t for m in modules for t in (*m.parameters(), *m.buffers())])
    with reads, per_round(reads, loaded.device) as rounds:
        decode_turn(Target(loaded.model, loaded.device), method, prompt, DecodeSettings(new, 0.0, frozenset()))
    return rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--methods", default=",".join(ROUND_METHODS))
    ap.add_argument("--new", type=int, default=32, help="tokens of the one turn")
    a = ap.parse_args()
    device = torch.device(a.device)
    loaded = load_model(get_model_spec("smollm2-135m"), device, resolve_dtype(a.dtype, device).dtype)
    prompt = loaded.encode_chat([{"role": "user", "content": "Write a short story about a robot who paints."}])
    print(f"{'method':18} {'rounds':>6} {'reads/round':>11} {'uploads':>7} {'cuda syncs/round':>17}  where (a round)")
    for name in a.methods.split(","):
        rounds = method_rounds(name, loaded, prompt, a.new)
        sites = sum((r.sites + r.uploads for r in rounds), collections.Counter())
        uploads = max(r.uploads.total() for r in rounds)
        syncs = [r.cuda_syncs for r in rounds if r.cuda_syncs is not None]
        cuda = f"{statistics.median(syncs):g} (max {max(syncs)})" if syncs else "-"
        where = "; ".join(f"{n / len(rounds):g} {site}" for site, n in sites.most_common())
        print(f"{name:18} {len(rounds):>6} {max(r.reads for r in rounds):>11} {uploads:>7} {cuda:>17}  {where}",
              flush=True)


if __name__ == "__main__":
    main()
