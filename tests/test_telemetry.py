"""GPU telemetry: the torch device is found in NVML by UUID (not by index), energy is a counter delta, and
without a GPU or NVML nothing is recorded and nothing fails."""

from __future__ import annotations

import types

import torch

from specbench_cli import telemetry
from specbench_cli.telemetry import GpuTelemetry


class FakeNvml:
    """Two physical GPUs; the torch device (cuda:0 under CUDA_VISIBLE_DEVICES=1) is the second one."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def __init__(self) -> None:
        self.energy = {0: 5_000, 1: 100_000}

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return ["GPU-aaaa-0000", b"GPU-bbbb-1111"][h]

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H100 80GB HBM3"

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return 700_000  # milliwatts

    def nvmlDeviceGetClockInfo(self, h, kind):
        return {1: 1980, 2: 2619}[kind]

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        raise RuntimeError("not supported")  # a counter the GPU lacks is left out

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self.energy[h]


def with_fake_gpu(monkeypatch, nvml):
    monkeypatch.setattr(telemetry, "_nvml", lambda: nvml)
    props = types.SimpleNamespace(uuid="bbbb-1111")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    return GpuTelemetry(torch.device("cuda:0"))


def test_the_gpu_is_matched_by_uuid_and_described(monkeypatch):
    gpu = with_fake_gpu(monkeypatch, FakeNvml())
    assert gpu.handle == 1  # the second physical GPU, though torch calls it cuda:0
    assert gpu.info() == {"gpu_uuid": "GPU-bbbb-1111", "gpu_name_nvml": "NVIDIA H100 80GB HBM3", "driver": "550.54.15",
                          "cuda_driver": "12.4", "power_limit_w": 700.0, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619}


def test_energy_is_the_counter_delta_per_token(monkeypatch):
    nvml = FakeNvml()
    gpu = with_fake_gpu(monkeypatch, nvml)
    gpu.start()
    nvml.energy[1] += 12_500  # millijoules
    assert gpu.stop(tokens=250) == {"energy_j": 12.5, "energy_per_token_j": 0.05}


def test_no_matching_gpu_records_nothing(monkeypatch):
    nvml = FakeNvml()
    nvml.nvmlDeviceGetUUID = lambda h: "GPU-other"
    gpu = with_fake_gpu(monkeypatch, nvml)
    assert not gpu.available and gpu.info() == {}
    gpu.start()
    assert gpu.stop(tokens=10) == {}


def test_cpu_runs_have_no_gpu_telemetry():
    gpu = GpuTelemetry(torch.device("cpu"))
    assert not gpu.available and gpu.info() == {} and gpu.stop(tokens=3) == {}
