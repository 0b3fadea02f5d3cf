"""specbench's routed methods inside vLLM (HVD, WhiFlash): proposers installed through vLLM's plugin mechanism.

vLLM (0.32) builds one proposer per engine (`vllm/v1/worker/gpu_model_runner.py`, `GPUModelRunner.__init__`,
which the CPU runner inherits), and its model-free `custom_class` proposer gets no target hidden states, which
EAGLE-3 needs. So a routed method is a subclass of vLLM's own `EagleProposer` — HVD's in `vllm_hvd.py` (it also
owns the suffix cache), WhiFlash's in `vllm_whiflash.py` (it also owns vLLM's DFlash proposer) — and `register`,
the `vllm.general_plugins` entry point (pyproject.toml) that vLLM calls in every process it starts (engine core
and workers), swaps the runner's `EagleProposer` for it when SPECBENCH_ROUTED names a settings file, and does
nothing otherwise. `scripts/setup-vllm.sh` installs specbench into vLLM's Python (no dependencies) for the
entry point; the proposers import only vLLM, torch, numpy and `methods.{hvd_features,predictors,router_policies}`
(each router's decision and recorded extras are router_policies' functions, the ones our engine's methods call).

Both run with `disable_padded_drafter_batch`, so the proposer is called after the step's tokens are booked into
the input batch. Each step, per request with new tokens, the proposer decides and writes one JSON line to the
settings' log (`vllm_steps.StepLog`): request id (vLLM's, with its random suffix), source, and the round extras our engine
records for the method. `Decisions` reads them back on specbench's side (engines/vllm.py) as requests finish.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from specbench_cli.engines.vllm_steps import ENV, HVD_METHODS, READY


def register() -> None:
    """vLLM's `vllm.general_plugins` hook: with SPECBENCH_ROUTED set, EAGLE-3 runners build the routed proposer."""
    path = os.environ.get(ENV)
    if not path:
        return
    import vllm
    from vllm.v1.worker import gpu_model_runner

    from specbench_cli.engines.vllm_methods import TESTED_VERSIONS

    minor = ".".join(vllm.__version__.split(".")[:2])
    if minor not in TESTED_VERSIONS:
        raise RuntimeError(f"specbench's routed proposers support vLLM {', '.join(TESTED_VERSIONS)}; this is "
                           f"{vllm.__version__} (the runner and proposer internals they use may differ)")
    if json.loads(Path(path).read_text())["method"] in HVD_METHODS:
        from specbench_cli.engines.vllm_hvd import proposer_class
    else:
        from specbench_cli.engines.vllm_whiflash import patch_runner, proposer_class

        patch_runner(gpu_model_runner.GPUModelRunner)
    if not getattr(gpu_model_runner.EagleProposer, "specbench", False):  # once per process
        gpu_model_runner.EagleProposer = proposer_class(gpu_model_runner.EagleProposer)


# ---------------------------------------------------------------------------------------------- specbench's side
class Decisions:
    """The proposer's log, read back as requests finish: per request (our id), its decisions in step order."""

    def __init__(self, log: Path) -> None:
        self.log, self.offset = log, 0
        self.pending: dict[str, list[dict]] = {}
        self.started = False

    @classmethod
    def prepare(cls, folder: Path, settings: dict, tokenizer, vocab: int) -> tuple[dict[str, str], Decisions]:
        """Write the proposer's settings (HVD: with the vocabulary's class table) and an empty log into the run
        folder; the environment that makes vLLM build the proposer, and the log's reader."""
        log, path = folder / "routed-steps.jsonl", folder / "routed-proposer.json"
        settings = {**settings, "log": str(log)}
        if settings["method"] in HVD_METHODS:
            import numpy as np

            from specbench_methods.hvd_features import token_classes

            np.save(folder / "hvd-classes.npy", token_classes(tokenizer, vocab))
            settings["classes"] = str(folder / "hvd-classes.npy")
        log.write_text("")  # one engine start per session: request ids repeat across sessions
        path.write_text(json.dumps(settings, indent=2))
        # the proposer swap reaches vLLM's V1 model runner only; vLLM picks V2 wherever Triton works and nothing it
        # lacks is asked for (vllm/config/vllm.py:702-739, use_v2_model_runner), so on a GPU it must be told.
        # A CPU build has no Triton and runs V1 either way (docs/vllm-engine.md, section 2).
        return {ENV: str(path), "VLLM_USE_V2_MODEL_RUNNER": "0"}, cls(log)

    def take(self, request_id: str) -> list[dict]:
        """`request_id`'s decisions (vLLM appends a random suffix to the id it was given: `-` and 8 characters)."""
        self.read()
        return self.pending.pop(request_id, [])

    def read(self) -> None:
        """Take in the lines written since the last read."""
        with self.log.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]  # a line being written is read next time
        self.offset += len(complete)
        for line in complete.decode().splitlines():
            entry = json.loads(line)
            if entry.get("event") == READY:
                self.started = True
            else:
                self.pending.setdefault(entry["request"].rsplit("-", 1)[0], []).append(entry)
