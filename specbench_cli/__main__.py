"""`python -m specbench_cli` runs the same command line as `specbench`."""

from specbench_cli.cli import main

main()
