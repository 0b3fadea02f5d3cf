"""How a method declares its options: an `Options` dataclass per method, and a routed method's proposers'
options as fields of its own (`proposer_options`), found again by `nested`. Reading `--opt` strings into them is
the commands' business (`specbench_cli/options.py`)."""

from __future__ import annotations

import dataclasses
from dataclasses import field


def proposer_options(options_cls: type, **defaults) -> object:
    """A field of a routed method's Options holding one proposer's own Options (`defaults`: where the routed
    method's paper sets them otherwise). `--opt NAME.key=value` reaches it, parsed and range-checked by the
    proposer's own Options."""
    return field(default_factory=lambda: options_cls(**defaults), metadata={"proposer": True})


def nested(options_cls: type) -> dict[str, type]:
    """The proposer fields of an Options class, name -> the proposer's Options class."""
    return {f.name: type(f.default_factory()) for f in dataclasses.fields(options_cls) if f.metadata.get("proposer")}
