"""Child process that owns a llama.cpp model: JSON lines in on stdin, JSON lines out.

It runs apart from the daemon so that a native crash (a segfault in a CPU-specific kernel) or
a hang kills only this process; `llamacpp.py` notices, restarts it and reports the failure.
Native code may print to stdout, so the protocol uses a duplicate of the original stdout and
fd 1 is pointed at stderr before llama.cpp is imported.

Requests: {"id", "op": "load", "model_path", "n_ctx", "n_threads", "seed"}
          {"id", "op": "chat", "messages", "schema", "temperature", "seed", "max_tokens"}
Replies:  {"id", "ok": true, ...} or {"id", "ok": false, "error": "..."}
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any


def _handle(state: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    op = req.get("op")
    if op == "ping":
        return {"ok": True, "pid": os.getpid()}
    if op == "load":
        from llama_cpp import Llama

        start = time.monotonic()
        state["llm"] = Llama(
            model_path=req["model_path"],
            n_ctx=int(req.get("n_ctx", 2048)),
            n_threads=int(req.get("n_threads", 2)),
            seed=int(req.get("seed", 42)),
            verbose=False,
        )
        return {"ok": True, "seconds": time.monotonic() - start}
    if op == "chat":
        llm = state.get("llm")
        if llm is None:
            return {"ok": False, "error": "no model loaded"}
        out = llm.create_chat_completion(
            messages=req["messages"],
            response_format={"type": "json_object", "schema": req["schema"]},
            temperature=float(req.get("temperature", 0.1)),
            seed=req.get("seed"),
            max_tokens=int(req.get("max_tokens", 768)),
        )
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        return {
            "ok": True,
            "content": choice["message"].get("content") or "",
            "finish_reason": choice.get("finish_reason"),
            "prompt_tokens": int(usage.get("prompt_tokens", 0)),
            "completion_tokens": int(usage.get("completion_tokens", 0)),
        }
    if os.environ.get("CLAGD_WORKER_TEST_OPS") == "1":
        # Failure injection for tests: a native crash and a hang, without a model.
        if op == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if op == "hang":
            time.sleep(3600)
    return {"ok": False, "error": f"unknown op {op!r}"}


def main() -> None:
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    state: dict[str, Any] = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        req: Any = {}
        try:
            req = json.loads(line)
            reply = _handle(state, req)
        except Exception as exc:  # reported to the parent, which raises BackendError
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        reply["id"] = req.get("id") if isinstance(req, dict) else None
        proto.write(json.dumps(reply) + "\n")
        proto.flush()


if __name__ == "__main__":
    main()
