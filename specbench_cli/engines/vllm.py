"""`specbench run --engine vllm`: the run's prompts decoded by a vLLM engine, recorded as our own engine's are.

vLLM runs in its own Python (`engines.options.engine_python`: `--engine-python`, `SPECBENCH_VLLM_PYTHON`, this interpreter if it
imports vllm, else the `.venv-vllm` that `scripts/setup-vllm.sh` makes), as `vllm_worker.py`, which drives
`vllm.LLMEngine` and answers in JSON lines. specbench keeps everything else: the prompts, the chat template
(token ids go to the engine, so both engines see the same ids), the closed loop of `--concurrency` requests,
the results folder and its records. Per request the worker reports each engine step's new tokens with the time
it saw them (perf_counter in the engine's process), and vLLM's per-request speculative metrics
(`per_request_spec_decode_metrics="detailed"`: accepted and drafted per verify step).

What the records mean here: TTFT = first token's step - the request's arrival in the engine; decode time =
last token's step - first token's; a rounds row is one engine step that gave the request tokens (emitted =
its new tokens, accepted = emitted - 1, tree_size = draft tokens verified), with no phase times (vLLM does not
expose them: the phase columns are null, `wall_ms` is the time since the request's previous step).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from rich.console import Console

from specbench_cli import hardware
from specbench_cli.core.errors import UsageError
from specbench_cli.models import parse_random
from specbench_cli.core.method import Proposer
from specbench_cli.conversations import Conversation, Throughput, turn_records, turn_seed
from specbench_cli.core.turn import RoundInfo, TurnResult
from specbench_cli.datasets import Prompt
from specbench_cli.engines.vllm_routed import Decisions
from specbench_cli.engines.vllm_methods import TESTED_VERSIONS, engine_method
from specbench_cli.greedy_replay import Replayed, Replayer, reference, replays
from specbench_cli.inputs import Plan
from specbench_cli.loading import LoadedModel, checkpoint_location, load_text, random_folder, target_weights
from specbench_cli.planning import check_lengths, drafter_ref, drafter_weights, loaded_target
from specbench_cli.records import run_parts
from specbench_cli.run_folder import RunFailed, RunInfo, Start, new_session
from specbench_cli.core.dtypes import dtype_name
from specbench_methods.checkpoints import locate

WORKER = Path(__file__).with_name("vllm_worker.py")
CLOCK = "perf_counter in the vLLM process (engine step outputs)"
# How vLLM runs best on a small CPU (docs/engines.md): the engine core in this process (it starts faster than
# a separate one), 1 GiB of KV cache, no thread pinning, one numba thread (without it the ngram proposer stalled
# for tens of seconds per batch). A variable the user set wins.
ENV_DEFAULTS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_CPU_OMP_THREADS_BIND": "nobind", "NUMBA_NUM_THREADS": "1"}
# Tokens per position whose log-probabilities a finished turn is scored with (`Worker.score`): vLLM's default
# max_logprobs (vllm/config/model.py, 0.32).
SCORE_TOP = 20
START_TIMEOUT_S = 900.0  # a first start compiles the model (slow on a small CPU); past this the engine counts as stuck


# ---------------------------------------------------------------------------------------------- settings
@dataclasses.dataclass
class Launch:
    """Everything that starts the engine, recorded in run.json (and compared on --resume)."""

    python: str
    engine_args: dict
    env: dict[str, str]
    speculative_config: dict | None

    def record(self) -> dict:
        return {"name": "vllm", "python": self.python, "engine_args": self.engine_args, "env": self.env,
                "speculative_config": self.speculative_config}  # with --engine-url: what the server should run


def launch(plan: Plan, env: dict[str, str], longest: int | None = None) -> Launch:
    """The engine's arguments for a planned run: our target folder, dtype and seed, the context the run needs
    (`sized`), the method's speculative config, per-request metrics, then the user's --engine-arg (which win).
    `longest`: the most positions a prompt of the run needs (`longest_needed`), found here when not given."""
    c = plan.config
    if longest is None:
        longest = longest_needed(plan, load_text(plan.spec))
    folder = target_folder(plan)  # a hub target's snapshot, resolved and checked once for the whole launch
    config = json.loads((Path(folder) / "config.json").read_text())
    args: dict = {"model": folder, "dtype": dtype_name(plan.dtype), "seed": c.seed, **sized(plan, longest, config)}
    engine = plan.engine
    if engine.speculative_config is not None:
        args |= {"speculative_config": engine.speculative_config, "per_request_spec_decode_metrics": "detailed"}
    args |= engine.args
    # the engine's CPU threads: --threads, else as many as our engine would use (torch's count), so the two
    # engines are compared on the same cores; a spinning OpenMP pool on more threads than idle cores crawls
    threads = str(c.threads or torch.get_num_threads())
    defaults = {**ENV_DEFAULTS, "OMP_NUM_THREADS": threads}
    if plan.device.type == "cpu":
        defaults["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kv_gib(plan, args.get("max_model_len", longest), config))
    worker_env = {k: env.get(k, v) for k, v in defaults.items()}
    return Launch(engine.python, args, worker_env, engine.speculative_config)


# Positions past a prompt's last token that a round's drafts may take (vLLM verifies them within max_model_len).
DRAFT_ROOM = 64
# vLLM's share of a GPU's memory by default (vllm/config/cache.py, CacheConfig.gpu_memory_utilization = 0.9);
# the engines of a `--engine vllm` list split it (`EnginePlan.share`), so that they never oversubscribe one GPU.
GPU_MEMORY_UTILIZATION = 0.9


def sized(plan: Plan, longest: int, config: dict) -> dict:
    """What the run needs of the engine's memory, unless --engine-arg sets it: `max_model_len` the longest prompt
    plus --max-new-tokens and a round's drafts (vLLM otherwise sizes for the model's whole context, 131,072
    positions for Llama-3.1, whose KV cache alone is 16 GiB for one sequence), and on a GPU the engine's share of
    its memory when a list of methods runs one engine each beside the others. `config`: the target's config.json."""
    context = config.get("max_position_embeddings")
    args = {"max_model_len": min(longest + DRAFT_ROOM, context) if context else longest + DRAFT_ROOM}
    if plan.device.type == "cuda":
        args["gpu_memory_utilization"] = round(GPU_MEMORY_UTILIZATION * plan.engine.share, 4)
    return {k: v for k, v in args.items() if k not in plan.engine.args}


def target_config(plan: Plan) -> dict:
    return json.loads((Path(target_folder(plan)) / "config.json").read_text())


def cpu_kv_gib(plan: Plan, positions: int, config: dict) -> int:
    """GiB of KV cache for vLLM's CPU engine (VLLM_CPU_KVCACHE_SPACE, which it reserves whole): the target's keys
    and values (its config.json's sizes) for `positions` per request in flight, doubled for the drafter's and for
    vLLM's blocks, at least 1."""
    heads = config.get("num_attention_heads", 1)
    head_dim = config.get("head_dim") or config.get("hidden_size", 0) // heads
    per_token = 2 * config.get("num_hidden_layers", 1) * config.get("num_key_value_heads", heads) * head_dim
    total = 2 * per_token * plan.dtype.itemsize * positions * max(1, plan.config.concurrency)
    return max(1, math.ceil(total / 2**30))


def target_folder(plan: Plan) -> str:
    """The checkpoint the engine loads: the target's, or a random target written as one (`loading.random_folder`:
    drawn the first time, before the engine starts)."""
    weights = parse_random(plan.spec.target)
    return str(random_folder(weights, plan.dtype)) if weights is not None else checkpoint_location(plan.spec)


def _local(plan: Plan, name: str) -> str:
    """Drafter `name` as a folder vLLM loads: a local one as it is, a hub id's snapshot (found in the cache or
    downloaded here, at its pinned revision) in its place, since vLLM is handed folders, never ids to resolve."""
    ref = drafter_ref(plan.method_cls, plan.spec, plan.drafters, name)
    folder = locate(ref, f"drafter '{name}'")
    if not folder.is_dir():
        raise UsageError(f"--engine vllm needs drafter '{name}' as a folder (got the file {ref})")
    return str(folder)


def plan_engine(plan: Plan) -> Plan:
    """The method as vLLM runs it (`vllm_methods.engine_method`), before anything starts."""
    given = {o.partition("=")[0].strip() for o in plan.config.opts}
    names = list(plan.method_cls.drafter_names)
    reads = getattr(plan.method_cls, "reads_calibration", None)  # WhiFlash's thresholds: a card unless --opt threshold
    if reads is not None and reads(plan.options) and plan.method_cls.calibration not in names:
        names.append(plan.method_cls.calibration)
    drafters = {name: _local(plan, name) for name in names}
    if "sps" in drafters:
        drafters["sps"] = whole_draft_model(Path(drafters["sps"]), Path(target_folder(plan)))
    mapped = engine_method(plan.config.method, plan.options, given, drafters)
    if mapped.proposer and (plan.config.engine_url or plan.config.engine_serve):
        raise UsageError(f"--engine vllm runs {plan.config.method} inside the engine process specbench starts (its "
                         f"proposer is a vLLM plugin, engines/vllm_routed.py); drop --engine-url/--engine-serve")
    if mapped.proposer and not has_plugin(plan.engine.python):
        raise UsageError(f"--engine vllm runs {plan.config.method} as a vLLM plugin, which {plan.engine.python} lacks: "
                         f"run `bash scripts/setup-vllm.sh`, or `pip install --no-deps -e <specbench>` in that Python")
    config = mapped.speculative_config
    if plan.acceptance is not None:
        config = synthetic_config(config, plan.acceptance.rates, plan.config.method, plan.device)
    if config is not None and plan.engine.schedule:  # `tune --engine vllm`'s table: K per batch size, capped by config's
        config = {**config, "num_speculative_tokens_per_batch_size": plan.engine.schedule}
    engine = dataclasses.replace(plan.engine, speculative_config=config,
                                 known_differences=mapped.known_differences, proposer=mapped.proposer)
    plan = dataclasses.replace(plan, options=mapped.options, notes=[*plan.notes, *mapped.notes], engine=engine)
    if plan.config.engine_url:  # an unreachable server is said before the results folder is taken
        from specbench_cli.engines import vllm_server

        vllm_server.wait_healthy(plan.config.engine_url.rstrip("/"), vllm_server.HEALTH_WAIT_S)
    return plan


def synthetic_config(config: dict | None, rates: tuple[float, ...], method: str, device: torch.device) -> dict:
    """`--acceptance` as vLLM's own synthetic rejection sampler (vllm/config/speculative.py, SpeculativeConfig
    `rejection_sample_method="synthetic"`; vllm/v1/sample/rejection_sampler.py), which takes the unconditional
    rate of each of the K positions (the probability that the first i + 1 drafts are all accepted): the
    products of our conditional rates, the last one repeated to K. vLLM's CPU sampling refuses it
    (vllm/utils/cpu_triton_utils.py asserts "Synthetic acceptance not supported with CPU sampling")."""
    if device.type == "cpu":
        raise UsageError("--acceptance with --engine vllm: vLLM's synthetic sampler does not run on its CPU "
                         "engine (it does on CUDA); on a CPU use our engine (drop --engine)")
    if config is None or "num_speculative_tokens" not in config:
        raise UsageError(f"--acceptance with --engine vllm needs a draft of fixed length; vLLM runs {method} "
                         "without one")
    k, unconditional, running = int(config["num_speculative_tokens"]), [], 1.0
    for i in range(k):
        running *= rates[min(i, len(rates) - 1)]
        unconditional.append(round(running, 6))
    return {**config, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": unconditional}


def has_plugin(python: str) -> bool:
    """Whether that Python has vLLM and specbench's plugin for it (the `vllm.general_plugins` entry point
    `specbench_routed`); asked without importing vLLM, from a folder where nothing of ours shadows a package."""
    import tempfile

    probe = ("import importlib.util; from importlib.metadata import entry_points; print(importlib.util.find_spec("
             "'vllm') is not None and any(e.name == 'specbench_routed' for e in entry_points(group='vllm.general_plugins')))")
    with tempfile.TemporaryDirectory() as here:
        found = subprocess.run([os.path.abspath(python), "-c", probe], capture_output=True, text=True, cwd=here,
                               timeout=60)  # abspath, not resolve: a venv's python is a link its venv needs
    return found.stdout.strip() == "True"


def whole_draft_model(folder: Path, target: Path) -> str:
    """A draft model vLLM can load. The draft models `train-drafter` makes ship no embedding or head (config
    `specbench_embedding_from_target`: ours copies the target's in at load, `specbench_methods.sps.load_draft_model`), and
    vLLM's draft_model proposer would run them with none; this writes, once per draft and target, a folder with
    the target's tied embedding added, under the cache. Any other folder is used as it is."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from specbench_methods.checkpoints import fingerprint
    from specbench_methods.sps import EMBEDDING_FROM_TARGET
    from specbench_cli.models import cache_root

    config = json.loads((folder / "config.json").read_text())
    if not config.get(EMBEDDING_FROM_TARGET):
        return str(folder)
    whole = cache_root() / "vllm-drafters" / f"{folder.name}-{fingerprint(folder)}-{fingerprint(target)}"
    if (whole / "model.safetensors").exists():
        return str(whole)
    tensors = {}
    for source in (*sorted(folder.glob("*.safetensors")), *sorted(target.glob("*.safetensors"))):
        with safe_open(source, "pt") as f:
            for key in f.keys():
                if source.parent == folder or key == "model.embed_tokens.weight":
                    tensors[key] = f.get_tensor(key)
    if "model.embed_tokens.weight" not in tensors:
        raise UsageError(f"{target} has no model.embed_tokens.weight for the draft model {folder} to share")
    dtype = next(t.dtype for k, t in tensors.items() if k != "model.embed_tokens.weight")
    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].to(dtype)
    whole.mkdir(parents=True, exist_ok=True)
    (whole / "config.json").write_text(json.dumps({**{k: v for k, v in config.items() if k != EMBEDDING_FROM_TARGET},
                                                   "tie_word_embeddings": True}, indent=2))
    save_file(tensors, whole / ".model.safetensors.tmp", metadata={"format": "pt"})
    (whole / ".model.safetensors.tmp").rename(whole / "model.safetensors")
    return str(whole)


# ---------------------------------------------------------------------------------------------- the engine
class EngineDied(RunFailed):
    """The engine process ended or failed; the message has its last words."""


class Worker:
    """The engine process: started with `Launch`, fed requests, read for finished ones, always stopped."""

    def __init__(self, spec: Launch, log: Path) -> None:
        self.spec, self.log = spec, log
        self.process: subprocess.Popen | None = None
        self.ready: dict = {}
        self.scored = 0

    def launch(self) -> None:
        """Start the engine process without waiting for it (once): the engines of a list boot side by side."""
        if self.process is not None:
            return
        env = {**os.environ, **self.spec.env}
        with self.log.open("a") as log:  # the engine's own output; new session: Ctrl-C reaches us, and we stop it
            self.process = subprocess.Popen([self.spec.python, str(WORKER)], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                                            start_new_session=True)
        self._send({"engine_args": self.spec.engine_args})

    def __enter__(self) -> Worker:
        return self.started()

    def started(self) -> Worker:
        """Launched (if it was not) and ready: vLLM's "ready" line read."""
        self.launch()
        if not self.ready:
            self.ready = self._read("ready", START_TIMEOUT_S)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Close the engine (killed if it does not end within 30 s); nothing if it has ended or never started."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self._send({"op": "close"})
            self.process.wait(timeout=30)
        except (OSError, ValueError, subprocess.TimeoutExpired, EngineDied):
            self.process.kill()
            self.process.wait()

    def submit(self, request: dict) -> None:
        self._send({"op": "add", **request})

    def next_done(self) -> dict:
        return self._read("done", None)

    def absorb(self, output_ids: list[int]) -> bool:
        """A finished output into the engine's suffix cache, where its drafter keeps one (the worker's "absorb";
        WhiFlash's drafters keep none, and there is nothing to fill); True: the engine holds what an uninterrupted
        run's would."""
        self._send({"op": "absorb", "output_ids": output_ids})
        self._read("absorbed", 60.0)
        return True

    def forget(self) -> None:
        """The engine's suffix cache and prefix cache emptied (the worker's "forget")."""
        self._send({"op": "forget"})
        self._read("forgotten", 60.0)

    def score(self, prompt_ids: list[int], output_ids: list[int]) -> list[dict[int, float]]:
        """The engine's log-probabilities of its top SCORE_TOP tokens (and the emitted one) at every output position
        of a finished turn, from one prefill over prompt and output: the engine's verify of the whole turn (the
        worker's "score"). Untimed, after the run."""
        self.scored += 1
        self._send({"op": "score", "id": f"score-{self.scored}", "ids": [*prompt_ids, *output_ids],
                    "from": len(prompt_ids), "top": SCORE_TOP})
        return [{token: lp for token, lp in row} for row in self._read("scored", None)["logprobs"]]

    def _send(self, message: dict) -> None:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died() from None

    def _read(self, event: str, timeout: float | None) -> dict:
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(self.process.stdout, selectors.EVENT_READ)
            if timeout is not None and not sel.select(timeout):
                self.process.kill()
                raise EngineDied(f"vLLM did not start within {timeout:.0f} s (its log: {self.log})")
        line = self.process.stdout.readline()
        if not line:
            raise self._died()
        message = json.loads(line)
        if message.get("event") == "error":
            raise EngineDied(f"vLLM failed: {message['message']} (its log: {self.log})")
        if message.get("event") != event:
            raise EngineDied(f"vLLM sent '{message.get('event')}' where '{event}' was due (its log: {self.log})")
        return message

    def _died(self) -> EngineDied:
        code = self.process.wait()
        tail = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()][-1:]
        return EngineDied(f"the vLLM process ended (exit {code}): {tail[0][-300:] if tail else 'no output'} "
                          f"(its log: {self.log})")


# ---------------------------------------------------------------------------------------------- replies
def turn_result(reply: dict, prompt_len: int, proposer: str, decisions: list[dict] | None = None) -> TurnResult:
    """One finished request as our engine's `TurnResult`: each engine step after the first token a round. With
    `decisions` (a routed proposer's, engines/vllm_routed.py: one per step, made after it, so the k-th decides
    round k), a round's proposer and extras are its decision's."""
    steps = reply["steps"]
    spec = reply.get("spec") or {}
    verified = _verify_steps([n for _, n in steps[1:]], spec.get("per_step_accepted", []),
                             spec.get("per_step_drafted", []))
    rounds, length, before = [], prompt_len + steps[0][1], steps[0][0]
    for i, ((t, n), (drafted, accepted)) in enumerate(zip(steps[1:], verified)):
        source, extras = proposer, {}
        if decisions is not None:
            if i >= len(decisions):
                raise RunFailed(f"the routed proposer logged {len(decisions)} decisions for request {reply['id']}, "
                                f"which took {len(steps) - 1} steps after its first token")
            source = decisions[i]["source"]
            extras = {k: tuple(v) if isinstance(v, list) else v for k, v in decisions[i]["extras"].items()}
        rounds.append(RoundInfo(proposer=source, tree_size=drafted, draft_depth=drafted, accepted=accepted,
                                emitted=n, kv_len=length, target_forwards=1, extras=extras,
                                phases={"wall": (t - before) * 1e3}))
        length, before = length + n, t
    stop = "stop_token" if reply["finish_reason"] == "stop" else "max_new_tokens"
    return TurnResult(reply["output_ids"], stop, (steps[0][0] - reply["arrival"]) * 1e3,
                      (steps[-1][0] - steps[0][0]) * 1e3, rounds)


def _verify_steps(emitted: list[int], accepted: list[int], drafted: list[int]) -> list[tuple[int, int]]:
    """(draft tokens verified, draft tokens accepted) for each step that emitted n tokens. vLLM lists verify
    steps only for steps that had a draft, so the lists are matched to the steps in order: a step takes the next
    entry when that entry accepted n - 1 (or, for the last step, at least n - 1: --max-new-tokens may cut what
    it emits, as our engine records it: accepted as verified, emitted as kept), else it had no draft. Exact when
    every step drafts (EAGLE-3, DFlash, a draft model); for n-gram and suffix drafts two neighbouring one-token
    steps may swap their counts."""
    out, j = [], 0
    for i, n in enumerate(emitted):
        last = i == len(emitted) - 1
        if j < len(accepted) and (accepted[j] == n - 1 or (last and accepted[j] >= n - 1)):
            out.append((drafted[j], accepted[j]))
            j += 1
        else:
            out.append((0, n - 1))
    return out


# ---------------------------------------------------------------------------------------------- the run
class ClosedLoop:
    """Keeps `concurrency` conversations in flight: a turn's answer starts the conversation's next turn, a
    finished conversation's slot takes the next prompt. `on_done(conversation)` sees each finished one."""

    def __init__(self, worker: Worker, plan: Plan, text: LoadedModel, decisions: Decisions | None = None) -> None:
        self.worker, self.plan, self.text, self.decisions = worker, plan, text, decisions
        self.proposer = plan.config.method

    def run(self, todo: list[tuple[int, Prompt]], concurrency: int, on_done, tag: str = "") -> None:
        waiting = collections.deque(Conversation(i, p) for i, p in todo)
        live: dict[str, Conversation] = {}
        while waiting or live:
            while waiting and len(live) < concurrency:
                self._next_turn(waiting.popleft(), live, tag)
            reply = self.worker.next_done()
            conv = live.pop(reply["id"])
            decisions = None if self.decisions is None else self.decisions.take(reply["id"])
            conv.add(turn_result(reply, len(conv.pending), self.proposer, decisions), self.text)
            if not conv.finished:
                self._next_turn(conv, live, tag)
            else:
                on_done(conv)

    def _next_turn(self, conv: Conversation, live: dict, tag: str) -> None:
        turn = conv.turn
        ids = conv.next_ids(self.text)
        c = self.plan.config
        seed = turn_seed(c.seed, conv.prompt, turn)
        request = f"{tag}{conv.index}.{turn}"
        self.worker.submit({"id": request, "prompt_ids": ids, "max_tokens": c.max_new_tokens,
                            "temperature": c.temperature, "seed": seed, "stop_ids": sorted(self.text.stop_ids),
                            "extra_args": {"category": conv.prompt.category}})  # WhiFlash's thresholds are per category
        live[request] = conv


class VllmJob:
    """`run --engine vllm`'s rows: the run's prompts decoded by the engine (`ClosedLoop`, `--concurrency` in
    flight), recorded as our engine's are; `run_folder.record` does the folder's life, or, a member of a list of
    methods, `run_folder.record_interleaved` (one prompt at a time: `decode`, `new_pass`). On `--resume` the
    finished prompts' outputs go into the engine's suffix cache, where the method has one (`Worker.absorb`)."""

    def __init__(self, plan: Plan, console: Console, model: LoadedModel | None = None) -> None:
        if model is not None:
            raise RuntimeError("--engine vllm loads its own target: a loaded model cannot be handed to it")
        self.plan, self.console = plan, console
        self.label = f"{plan.config.method} on {plan.config.dataset} (vLLM)"
        self.stats_ = Throughput()
        self.warmed = 0
        self.noted = False
        self.shared: Worker | None = None  # an engine started by the caller for several runs (`on`)
        self.decoded: list[Conversation] = []  # this session's prompts, to replay once the engine has stopped
        self.scores: list[list] = []  # their turns as the engine scored them (`_score`), in the same order

    def on(self, worker: Worker) -> VllmJob:
        """Run on an engine the caller started and will stop, one engine for several runs (`tune --engine vllm`:
        each candidate's engine serves every --concurrency level); its caches are emptied as the run starts, as a
        new engine's are."""
        self.shared = worker
        return self

    def begin(self) -> Start:
        self.weights = drafter_weights(self.plan)
        self.target_weights = target_weights(self.plan.spec)
        return Start(self.plan.settings(), new_session(self.plan.device), weights=self.weights,
                     target=self.target_weights)

    def prepare(self) -> dict:
        plan = self.plan
        self.text = load_text(plan.spec)
        self.spec = launch(plan, dict(os.environ), longest_needed(plan, self.text))
        self.decisions = None
        if plan.engine.proposer:  # a routed method inside vLLM: its plugin reads these files (engines/vllm_routed.py)
            vocab = int(target_config(plan)["vocab_size"])
            extra, self.decisions = Decisions.prepare(plan.out, plan.engine.proposer, self.text.tokenizer, vocab)
            self.spec.env.update(extra)
        if self.shared is None:
            self.engine, self.clock = open_engine(plan, self.spec, plan.out / "engine.log")
        elif (self.shared.spec.engine_args, self.shared.spec.env) != (self.spec.engine_args, self.spec.env):
            raise RuntimeError(f"{plan.out}: the shared engine was started with other settings than this run's")
        else:
            self.engine, self.clock = nullcontext(self.shared), CLOCK
        # replayed once the engine has stopped; an engine shared by several runs (tune's) or a server someone else
        # runs is still up then, and our reference target may find no room beside it
        self.replaying = replays(plan.config) and self.shared is None and not plan.config.engine_url
        return {"clock": self.clock, "prompts_selected": len(plan.prompts), "drafter_weights": self.weights, "target_weights": self.target_weights,
                "dtype_choice": plan.dtype_reason, "engine": self.spec.record(),
                "replay": reference(plan.device) if self.replaying else "off"}

    @contextmanager
    def running(self, info: RunInfo, save: Callable[[], None]) -> Iterator[None]:
        """Start the engine (stopped when the block ends), check a resumed run's vLLM version, note the engine in
        run.json."""
        plan = self.plan
        with self.engine as worker:
            self.worker = worker
            if self.shared is not None:
                worker.forget()
            version = worker.ready["version"]
            recorded = info.more.get("engine", {}).get("version")
            if recorded not in (None, version):
                raise RunFailed(f"--resume: the run was recorded with vLLM {recorded}, this is {version}")
            info.more["engine"] = {**self.spec.record(), **{k: v for k, v in worker.ready.items()
                                                            if k != "speculative_config"},
                                   "engine_config": worker.ready["speculative_config"],
                                   "known_differences": plan.engine.known_differences}
            save()
            if self.shared is None:  # an engine serving several runs was announced by whoever started it
                self.console.print(f"vLLM {version} ({worker.ready.get('url', self.spec.python)})" +
                                   ("" if version.rsplit(".", 1)[0] in TESTED_VERSIONS else
                                    f"; specbench's method mapping was tested on vLLM {', '.join(TESTED_VERSIONS)} only"),
                                   highlight=False, soft_wrap=True)
            if self.decisions is not None:
                self.decisions.read()  # the proposer's first line is written when vLLM builds it
                if not self.decisions.started:
                    raise RunFailed(f"vLLM did not build specbench's {plan.config.method} proposer (its plugin failed "
                                    f"to load or refused this vLLM version; see {plan.out / 'engine.log'})")
            self.loop = ClosedLoop(worker, plan, self.text, self.decisions)
            yield
            self._score(worker)

    def _score(self, worker) -> None:
        """Every turn to be replayed scored by the engine (`Worker.score`) while it is still up, after the timed
        run: the replay measures the engine's verify against our reference with it (greedy_replay.py). A server
        (`--engine-serve`) is not asked."""
        if hasattr(worker, "score"):
            self.scores = [[worker.score(ids, r.output_ids) for ids, r in c.turns] for c in self.decoded]

    @contextmanager
    def starting(self) -> Iterator[None]:
        """The engine process started in the background (a member of a list: `run_folder.record_interleaved` starts
        every member's before it waits for any, so they boot side by side); stopped on the way out if `running`
        never took it over (a member before it failed). A server is started by `running` alone."""
        if isinstance(self.engine, Worker):
            self.engine.launch()
        try:
            yield
        finally:
            if isinstance(self.engine, Worker):
                self.engine.stop()

    def warm_up(self, prompt: Prompt) -> None:
        self.loop.run([(self.warmed, prompt)], 1, lambda conv: None, tag="warmup-")
        self.warmed += 1

    def absorb(self, output_ids: list[int]) -> None:
        """A finished output into the engine's cross-request state (the suffix cache of suffix and HVD): what an
        uninterrupted run's engine would hold. Methods with no such state (the proposer's `absorb` is the
        default) need nothing."""
        if self.plan.method_cls.absorb is not Proposer.absorb and not self.worker.absorb(output_ids) and not self.noted:
            self.noted = True
            self.console.print("note: a vLLM server's suffix cache cannot be filled from outside: the resumed prompts "
                               "draft without the finished prompts' outputs (τ may differ from an uninterrupted run's)",
                               highlight=False, soft_wrap=True)

    def decode_all(self, todo: list[tuple[int, Prompt]], finished: Callable[[int, Prompt, dict], None]) -> None:
        self.stats_.start()
        self.loop.run(todo, self.plan.config.concurrency,
                      lambda conv: finished(conv.index, conv.prompt, self._tables(conv)))

    def decode(self, index: int, prompt: Prompt) -> dict:
        """One prompt alone (a member of `run --method a,b --engine vllm`: `run_folder.record_interleaved`)."""
        tables: dict = {}
        self.stats_.start()
        self.loop.run([(index, prompt)], 1, lambda conv: tables.update(self._tables(conv)))
        self.stats_.stop()  # the throughput counts this member's prompts, not the time the others took
        return tables

    def new_pass(self) -> None:
        """A new pass of `--repeat`: the engine's suffix and prefix caches emptied, as a newly started engine's."""
        self.worker.forget()

    def _tables(self, conv: Conversation) -> dict:
        self.stats_.add(conv)
        if self.replaying:
            self.decoded.append(conv)
        return self._parts(conv)

    def _parts(self, conv: Conversation, replays: list[Replayed] | None = None) -> dict:
        rounds, rows = turn_records(self.plan, self.plan.out.name, self.clock, self.text.decode, conv.index,
                                    conv.prompt, conv.turns, engine="vllm", replays=replays)
        return run_parts(rounds, rows)

    def replayed(self) -> list[tuple[int, dict]]:
        """The engine's greedy turns replayed on our reference target (greedy_replay.py), loaded in this process
        only now that the engine has stopped (on a GPU it held the memory)."""
        convs, scores, self.decoded, self.scores = self.decoded, self.scores, [], []
        if not convs:
            return []
        model = loaded_target(self.plan, None)
        replayer = Replayer(model.model, model.device)
        scores += [None] * (len(convs) - len(scores))  # unscored: a server's, or a run that ended early
        return [(c.index, self._parts(c, replayer.turns(c.turns, s))) for c, s in zip(convs, scores)]

    def stats(self) -> str:
        return self.stats_.line()

    def facts(self, info: RunInfo) -> dict:
        info.more["throughput"] = self.stats_.summary()
        return {"tokens": self.stats_.tokens, **hardware.peak_memory(self.plan.device)}


def open_engine(plan: Plan, spec: Launch, log: Path):
    """The engine a run talks to, not yet started (enter it), and the clock its times are read with: a server at
    --engine-url, `vllm serve` started for --engine-serve, else vLLM's engine loop in a worker process."""
    from specbench_cli.engines import vllm_server

    c = plan.config
    if c.engine_url or c.engine_serve:
        args = {**spec.engine_args, "per_request_spec_decode_metrics": "detailed"}
        expect = vllm_server.Expect(plan.engine.speculative_config is not None, vllm_server.serve_hint(args))
        if c.engine_url:
            return vllm_server.Server(c.engine_url, expect), vllm_server.CLOCK
        return vllm_server.start(spec.python, args, spec.env, log, expect), vllm_server.CLOCK
    return Worker(spec, log), CLOCK


def longest_needed(plan: Plan, text: LoadedModel) -> int:
    return check_lengths(plan, text, target_config(plan).get("max_position_embeddings"))
