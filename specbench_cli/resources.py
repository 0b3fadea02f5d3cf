"""Where the vendored datasets and the committed drafters live.

In a clone or an editable install they are the folders `datasets/` and `drafters/` beside the package. A
non-editable install (`pip install .`, `pip install git+URL`) ships them inside the wheel as the data-only
packages `specbench_datasets` and `specbench_drafters` (see pyproject.toml), found here through the import
system, so the installed `specbench` works from any folder.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


def resource_dir(name: str) -> Path:
    """`datasets` or `drafters`: beside the package in a source checkout, else the installed data package.
    (Installed, the folder beside the package is site-packages, where `datasets` is Hugging Face's library.)"""
    beside = REPOSITORY / name
    if (REPOSITORY / "pyproject.toml").is_file() and beside.is_dir():
        return beside
    spec = importlib.util.find_spec(f"specbench_{name}")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return beside  # neither: the caller's own check names the missing file
