"""GPU telemetry through NVML (the `nvidia-ml-py` package, imported as `pynvml`): which physical GPU ran,
its driver, power limit and clocks, and the energy it spent over the decode.

NVML numbers GPUs physically and ignores CUDA_VISIBLE_DEVICES, so the torch device is matched to an NVML
handle by UUID, never by index. Whatever is unavailable (no GPU, no driver, a counter the GPU lacks) is
left out of the record; telemetry never fails a run.
"""

from __future__ import annotations

import torch


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no library, no driver, no GPU: no telemetry
        return None


def _strip(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-").removeprefix("mig-")


def find_handle(nvml, device: torch.device):
    """The NVML handle whose UUID is the torch device's, or None."""
    try:
        wanted = _strip(str(torch.cuda.get_device_properties(device).uuid))
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            if _strip(_text(nvml.nvmlDeviceGetUUID(handle))) == wanted:
                return handle
    except Exception:
        return None
    return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(code: int) -> str:
    """NVML's 12040 -> "12.4"."""
    return f"{code // 1000}.{code % 1000 // 10}"


def _try(read, scale: float = 1.0):
    try:
        value = read()
        return value * scale if isinstance(value, (int, float)) else _text(value)
    except Exception:
        return None


class GpuTelemetry:
    """Static facts about the GPU (`info`) and an energy meter over a stretch of work (`start`/`stop`)."""

    def __init__(self, device: torch.device) -> None:
        self.nvml = _nvml() if device.type == "cuda" else None
        self.handle = find_handle(self.nvml, device) if self.nvml else None
        self._start_mj: float | None = None

    @property
    def available(self) -> bool:
        return self.handle is not None

    def info(self) -> dict:
        if not self.available:
            return {}
        n, h = self.nvml, self.handle
        clock = getattr(n, "NVML_CLOCK_SM", 1), getattr(n, "NVML_CLOCK_MEM", 2)
        facts = {
            "gpu_uuid": _try(lambda: n.nvmlDeviceGetUUID(h)),
            "gpu_name_nvml": _try(lambda: n.nvmlDeviceGetName(h)),
            "driver": _try(n.nvmlSystemGetDriverVersion),
            "cuda_driver": _try(lambda: _cuda_version(n.nvmlSystemGetCudaDriverVersion())),
            "power_limit_w": _try(lambda: n.nvmlDeviceGetPowerManagementLimit(h), 1e-3),
            "sm_clock_mhz": _try(lambda: n.nvmlDeviceGetClockInfo(h, clock[0])),
            "mem_clock_mhz": _try(lambda: n.nvmlDeviceGetClockInfo(h, clock[1])),
            "sm_clock_max_mhz": _try(lambda: n.nvmlDeviceGetMaxClockInfo(h, clock[0])),
        }
        return {k: v for k, v in facts.items() if v is not None}

    def start(self) -> None:
        self._start_mj = self._energy_mj()

    def stop(self, tokens: int) -> dict:
        """Energy since `start` in joules, and per generated token; {} when the GPU has no energy counter."""
        end = self._energy_mj()
        if self._start_mj is None or end is None:
            return {}
        joules = (end - self._start_mj) / 1e3
        return {"energy_j": round(joules, 3), "energy_per_token_j": round(joules / tokens, 6) if tokens else None}

    def _energy_mj(self) -> float | None:
        if not self.available:
            return None
        value = _try(lambda: self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        return value if isinstance(value, float) else None
