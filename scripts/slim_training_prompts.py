"""Write the shipped training-prompt files from their upstream copies: each row keeps only the fields a prompt is
made of (`distill.row_prompt`: GSM8K's `question`, GPTeacher's `instruction` and `input`), in upstream order,
xz-compressed. The full files are 8.0 MB; what ships is 0.7 MB, and the prompts are the same strings in the same
order (`training_prompts` and `calibration_prompts` are unchanged).

    python scripts/slim_training_prompts.py UPSTREAM_DIR

UPSTREAM_DIR holds the three files named in datasets/train/SOURCE.md, byte for byte from the commits given there
(their upstream sha256 is checked); the script prints the sha256 of each slim content, which distill.TRAIN_FILES
and SOURCE.md record.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specbench_cli.datasets import DATASET_DIR, write_vendored  # noqa: E402

# upstream file -> (its sha256, the fields kept)
UPSTREAM = {
    "gsm8k_train.jsonl": ("17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465", ("question",)),
    "roleplay-simple-deduped-roleplay-instruct.json": ("b5d57a0d92162fd0b78988fe352e8512b435363919caf63efc3759d5a1555023",
                                                       ("instruction", "input")),
    "codegen-instruct.json": ("8b0be81f22b86bccab30f573351b62efb3391da229d2ee817a65ce0abb08b29d", ("instruction", "input")),
}


def slim(name: str, data: bytes, keep: tuple[str, ...]) -> bytes:
    """The rows with only `keep`, one JSON object per line (a .jsonl, whatever the upstream layout)."""
    text = data.decode()
    rows = [json.loads(line) for line in text.splitlines()] if name.endswith(".jsonl") else json.loads(text)
    return "".join(json.dumps({k: row.get(k, "") for k in keep}) + "\n" for row in rows).encode()


def main() -> None:
    upstream = Path(sys.argv[1])
    for name, (sha, keep) in UPSTREAM.items():
        data = (upstream / name).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha:
            sys.exit(f"{upstream / name}: not the upstream file SOURCE.md names (sha256 differs)")
        content = slim(name, data, keep)
        out = DATASET_DIR / "train" / f"{Path(name).stem}.prompts.jsonl.xz"
        write_vendored(out, content)
        print(f"{out.name}: {len(content):,} bytes, {out.stat().st_size:,} shipped, "
              f"sha256 {hashlib.sha256(content).hexdigest()}")


if __name__ == "__main__":
    main()
