"""Trace replay and the oracles: what each drafter would have accepted at every position of a greedy trace, and the `specbench oracle` command."""
