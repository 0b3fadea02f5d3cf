"""One kind of error for bad user input: the CLI prints its message on one line and exits 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UsageError(Exception):
    """Bad input from the user (unknown name, malformed option, missing file ...)."""


def unknown(kind: str, name: str, choices: Iterable[str]) -> UsageError:
    """Build an 'unknown X' error with a 'did you mean' hint drawn from `choices`."""
    choices = sorted(choices)
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else f"; choose from: {', '.join(choices)}"
    return UsageError(f"unknown {kind} '{name}'{hint}")
