"""What each engine takes on the command line: the checks `inputs.check_engine` runs through the engine registry
(`registry.ENGINES`: an entry's `check`) before torch or any engine starts, and the parsing of --engine-arg and of
the engine's Python."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

from specbench_cli.core.errors import UsageError
from specbench_cli.engines.vllm_methods import MAPPINGS
from specbench_cli.inputs import EnginePlan, RunConfig


def ours(config: RunConfig, env: dict[str, str]) -> None:
    """Our engine's: no production-engine settings (it takes --compile, --batch-invariant and --batch-size)."""
    if config.engine_args or config.engine_python or config.engine_url or config.engine_serve:
        raise UsageError("--engine-arg, --engine-python, --engine-url and --engine-serve are for --engine vllm")


def vllm(config: RunConfig, env: dict[str, str]) -> EnginePlan:
    """vLLM's: a method it runs, none of our engine's settings, a well-formed server address; the parsed
    --engine-arg and the engine's Python."""
    if config.method not in MAPPINGS:
        raise UsageError(f"--engine {config.engine} runs {', '.join(MAPPINGS)}; not {config.method}")
    ours_only = {"--compile": config.compile, "--batch-invariant on": config.batch_invariant == "on",
                 "--device split": config.device == "split"}
    for flag in (f for f, given in ours_only.items() if given):
        raise UsageError(f"{flag} is our engine's; with --engine {config.engine} pass engine settings as --engine-arg")
    if config.engine_url is not None:
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", config.engine_url):
            raise UsageError(f"--engine-url '{config.engine_url}': expected http://HOST:PORT of a running vLLM server")
        if config.engine_serve or config.engine_args or config.engine_python:
            raise UsageError("--engine-url measures a server as it was started: drop --engine-serve, --engine-arg "
                             "and --engine-python (start the server with the settings you want)")
        return EnginePlan()
    return EnginePlan(parse_engine_args(config.engine_args), engine_python(config.engine_python, env))


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
