"""`--dtype auto`: bf16 on a CPU with bf16 in hardware, float32 elsewhere, and the reason recorded."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specbench_cli import loading
from specbench_cli.cli import app
from specbench_cli.core.row_attention import kernel
from specbench_cli.loading import resolve_dtype
from tests.conftest import THREADS

CPU = torch.device("cpu")
REAL_FLAGS = loading.cpu_flags  # taken at import, before the conftest's autouse pin replaces it in each test
EPYC = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: avx2 avx512f amx_bf16 amx_tile amx_int8 avx512_bf16\n"
SKYLAKE = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: avx2 avx512f avx512bw avx512_vnni\n"


@pytest.fixture
def cpuinfo(monkeypatch, tmp_path):
    """cpuinfo(text): the machine's /proc/cpuinfo reads `text` (the suite's float32 pin undone for this test)."""
    def write(text: str) -> None:
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        monkeypatch.setattr(loading, "CPUINFO", path)
        monkeypatch.setattr(loading, "cpu_flags", REAL_FLAGS)
    return write


@pytest.mark.parametrize("text, flag", [(EPYC, "avx512_bf16"), (SAPPHIRE, "amx_bf16/avx512_bf16")])
def test_auto_is_bf16_on_a_cpu_with_native_bf16(cpuinfo, text, flag):
    cpuinfo(text)
    choice = resolve_dtype("auto", CPU)
    assert choice.dtype == torch.bfloat16
    assert choice.reason == f"auto: bfloat16, the CPU has {flag}"


@pytest.mark.parametrize("text", [SKYLAKE, "", "processor\t: 0\n"])
def test_auto_is_float32_without_it(cpuinfo, text):
    cpuinfo(text)
    choice = resolve_dtype("auto", CPU)
    assert choice.dtype == torch.float32 and "no native bf16" in choice.reason


def test_a_missing_cpuinfo_means_float32(monkeypatch, tmp_path):
    monkeypatch.setattr(loading, "CPUINFO", tmp_path / "absent")
    assert REAL_FLAGS() == frozenset()
    monkeypatch.setattr(loading, "cpu_flags", REAL_FLAGS)
    assert resolve_dtype("auto", CPU).dtype == torch.float32


def test_explicit_dtypes_and_the_oracle_keep_their_choice(cpuinfo):
    cpuinfo(EPYC)
    assert resolve_dtype("float32", CPU) == loading.DtypeChoice(torch.float32, "--dtype float32")
    assert resolve_dtype("bf16", CPU).dtype == torch.bfloat16
    assert resolve_dtype("auto", CPU, cpu_bf16=False).dtype == torch.float32  # the oracle's exact replay
    assert resolve_dtype("auto", torch.device("cuda")).dtype == torch.bfloat16


@pytest.mark.slow
def test_a_run_records_the_choice_and_why(cpuinfo, tmp_path):
    """On a CPU with avx512_bf16 a default run decodes in bf16 on the batch-invariant target (where the row kernel
    builds), replays on it, and says so."""
    cpuinfo(EPYC)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--method", "baseline", "--limit", "1", "--max-new-tokens", "4",
                                      "--warmup", "0", "--threads", THREADS, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "target in bfloat16 (auto: bfloat16, the CPU has avx512_bf16" in result.output
    info = json.loads((out / "run.json").read_text())
    assert info["settings"]["dtype"] == "bfloat16" and info["settings"]["batch_invariant"] is (kernel() is not None)
    assert info["replay"] == "batch-invariant target (exact)"
    assert info["dtype_choice"] == "auto: bfloat16, the CPU has avx512_bf16"
    assert "baseline · smollm2-135m · spec-bench · bfloat16" in result.output  # the summary's title


def test_a_calibration_timed_in_another_dtype_is_warned(capsys):
    from specbench_methods.checkpoints import timed_as, warn_if_stale

    here = timed_as(torch.bfloat16, CPU)
    assert here == "bfloat16 on cpu"
    warn_if_stale({"latency_dtype": "float32 on cpu"}, {}, "hvd", "smollm2-135m", here)
    assert "hvd's latencies were timed in float32 on cpu, this run is bfloat16 on cpu" in capsys.readouterr().err
    warn_if_stale({"latency_dtype": here}, {}, "hvd", "smollm2-135m", here)
    warn_if_stale({}, {}, "hvd", "smollm2-135m", here)  # a card from before latency_dtype: not judged
    assert capsys.readouterr().err == ""


def test_calibrate_refuses_an_unknown_dtype_before_loading():
    result = CliRunner().invoke(app, ["calibrate", "--method", "hvd", "--dtype", "half", "--out", "/nonexistent/x"])
    assert result.exit_code == 2 and "dtype" in result.output
