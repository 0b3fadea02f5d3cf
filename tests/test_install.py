"""What a non-editable install ships: every code package and every data folder, named in pyproject.toml.
(.ci/run installs the wheel into a fresh venv and runs it from another folder: scripts/check_install.sh.)"""

from __future__ import annotations

import tomllib
from pathlib import Path

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
