"""Production engines behind `specbench run --engine`: the same prompts, records and report as our own engine.

`specbench` is our decode loop (core/); `vllm` drives a vLLM engine in its own Python (`engines/vllm.py`, with
`engines/vllm_worker.py` on the engine's side). Engines sit beside the commands: they read the run's plan and
write its records, and nothing below them imports them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from specbench_cli.core.errors import UsageError

ENGINES = ("specbench", "vllm")


def parse_engine_args(pairs: list[str]) -> dict:
    """`--engine-arg key=value`, passed to the engine unchanged (`vllm.EngineArgs`); a value is read as JSON when
    it parses (numbers, true/false, lists, objects), else kept as text."""
    args = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise UsageError(f"malformed --engine-arg '{pair}': expected KEY=VALUE, e.g. tensor_parallel_size=2")
        try:
            args[key] = json.loads(value)
        except ValueError:
            args[key] = value
    if "speculative_config" in args or "model" in args:
        raise UsageError("--engine-arg may not set model or speculative_config: --model/--target and --method do")
    return args


def engine_python(given: str | None, env: dict[str, str]) -> str:
    """The Python that runs vLLM, or one line saying how to get one."""
    choice = given or env.get("SPECBENCH_VLLM_PYTHON")
    if choice:
        if not Path(choice).is_file():
            raise UsageError(f"engine Python {choice} does not exist (--engine-python / SPECBENCH_VLLM_PYTHON)")
        return choice
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        venv = root / ".venv-vllm" / "bin" / "python"
        if venv.is_file():
            return str(venv)
    raise UsageError("no vLLM found: run `bash scripts/setup-vllm.sh` (a CPU build in .venv-vllm), install vllm "
                     "here, or name its Python with --engine-python / SPECBENCH_VLLM_PYTHON")
