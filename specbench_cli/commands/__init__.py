"""What each command does, one module (or package) per command: `run` (run.py, interleave.py for a list of
methods), `profile`, `oracle/`, `calibrate/`, `report`, `tune/`, `sweep`, `train-drafter` (train/), and `run
--list` (listing.py). `cli.py` declares the commands and calls these; nothing below the commands imports them."""
