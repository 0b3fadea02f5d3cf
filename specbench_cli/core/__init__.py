"""The core every method stands on: the decode loop, the target, draft trees, acceptance, timing, errors and
the method contract. It imports nothing from `methods/` or from the commands above it (a test checks)."""
