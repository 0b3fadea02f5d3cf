"""What ran the benchmark: machine, libraries, project commit. Stored in run.json so numbers can be compared
only where they were measured alike."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

import torch

from specbench_cli.core.attention import cudnn_sdpa


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parent.parent
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: torch.device) -> dict:
    import transformers

    env = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "git_commit": git_commit(),
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda,
                   sdpa_cudnn=cudnn_sdpa())  # what loading.load_model sets (core.attention.leave_cudnn_out_of_sdpa)
    return env


def hardware_key(env: dict) -> str:
    """Runs compare (speedup) only when this matches."""
    return env.get("gpu") or env.get("cpu", "?")


def peak_memory(device: torch.device) -> dict:
    peaks = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        peaks["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        peaks["cuda_max_reserved_mb"] = torch.cuda.max_memory_reserved(device) / 2**20
    return peaks


def weight_bytes(model: torch.nn.Module) -> int:
    """gpt-fast's model size (`_get_model_size`: every parameter outside the input embedding table), with the
    output head counted even when tied to the embedding, since every decoded token reads it."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    seen, total = {embed.data_ptr()}, 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    if head.data_ptr() == embed.data_ptr():
        total += head.numel() * head.element_size()
    return total


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache (Linux sysfs), or None where it cannot be read."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * scale)
        except ValueError:
            continue
    return max(sizes) if sizes else None


def read_bandwidth(device: torch.device, reps: int = 5) -> float:
    """Measured bytes/s of reading a buffer far larger than any cache (a float32 sum over max(1 GiB, 8 × the
    CPU's last-level cache)): what a decode does to its weights, so the honest roofline for it. A copy of a
    buffer that fits in the cache overstates it (bytes written count too, and the cache serves the reads).
    Median of reps, at the current torch thread count."""
    import statistics
    import time

    size = max(2**30, 8 * (last_level_cache_bytes() or 0)) if device.type == "cpu" else 2**30
    x = torch.ones(size // 4, dtype=torch.float32, device=device)
    times = []
    for i in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        x.sum()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 1:
            times.append(time.perf_counter() - t0)
    return size / statistics.median(times)
