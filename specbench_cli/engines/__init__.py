"""The engines behind `specbench run --engine`: the same prompts, records and report for each.

`ENGINES` is their registry: `specbench` is our decode loop (core/, driven by `runner.py`'s jobs); `vllm` drives
a vLLM engine in its own Python (`engines/vllm.py`, with `engines/vllm_worker.py` on the engine's side). An
entry names its code as "module:attribute", imported only when a run uses it (as `registry.METHODS` does), so
choosing an engine is a look-up, never an `if engine == ...`. Engines sit beside the commands: they read the
run's plan and write its records through `run_folder.record`, and nothing below them imports them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from specbench_cli.core.errors import UsageError, unknown
from specbench_cli.registry import load


@dataclass(frozen=True)
class EngineEntry:
    job: str  # "module:function" (plan, console, model or None) -> the run_folder.PromptJob that runs the plan
    plan: str | None = None  # "module:function" (Plan) -> Plan: what the engine adds to a checked plan, or None
    about: str = ""

    def make_job(self, plan, console, model=None):
        return load(self.job)(plan, console, model)


@dataclass
class EnginePlan:
    """What a run on a production engine adds to its plan (`inputs.Plan.engine`; None on our engine): the parsed
    --engine-arg and the engine's Python (`inputs.check_engine`), then what the engine's `plan` hook fills (the
    speculative config the method maps to, where the engine drafts otherwise, a specbench proposer run inside it)."""

    args: dict = field(default_factory=dict)  # --engine-arg, parsed (`parse_engine_args`)
    python: str = ""  # the Python that runs the engine (`engine_python`; "" for a server at --engine-url)
    speculative_config: dict | None = None  # what the run asks the engine for (engines/vllm_methods.py)
    known_differences: list[str] = field(default_factory=list)  # where the engine drafts otherwise (run.json)
    proposer: dict | None = None  # specbench's own proposer inside the engine (engines/vllm_routed.py)
    schedule: list[list[int]] | None = None  # `run --tuned`: the draft length per batch size `tune` chose (vLLM's form)


ENGINES: dict[str, EngineEntry] = {
    "specbench": EngineEntry("specbench_cli.engines.specbench:run_job", None, "our decode loop (core/engine.py)"),
    "vllm": EngineEntry("specbench_cli.engines.vllm:VllmJob", "specbench_cli.engines.vllm:plan_engine",
                        "a vLLM engine in its own Python, or a vLLM server"),
}


def engine_entry(name: str) -> EngineEntry:
    if name not in ENGINES:
        raise unknown("engine", name, ENGINES)
    return ENGINES[name]


def plan_for_engine(plan):
    """The checked plan with what its engine adds (the vLLM speculative config, its Python), before anything
    starts."""
    entry = engine_entry(plan.config.engine)
    return plan if entry.plan is None else load(entry.plan)(plan)



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
