"""Child process that owns a llama.cpp model: JSON lines in on stdin, JSON lines out.

It runs apart from the daemon so that a native crash (a segfault in a CPU-specific kernel) or
a hang kills only this process; `llamacpp.py` notices, restarts it and reports the failure.
Native code may print to stdout, so the protocol uses a duplicate of the original stdout and
fd 1 is pointed at stderr before llama.cpp is imported.

Requests: {"id", "op": "load", "model_path", "n_ctx", "n_threads", "seed", "chat_format"}
          {"id", "op": "count", "messages"}  (the prompt's size in the model's own tokens)
          {"id", "op": "chat", "messages", "schema", "temperature", "seed", "max_tokens"}
Replies:  {"id", "ok": true, ...} or {"id", "ok": false, "error": "..."}
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

_INSTRUCT = re.compile(r"instruct|chat|(^|[-_ .])it($|[-_ .])", re.IGNORECASE)
_BASE = re.compile(r"(^|[-_ .])base($|[-_ .])|pretrain", re.IGNORECASE)
MESSAGE_OVERHEAD = 8
ORPHAN_POLL = 0.5  # seconds between looks at whether the daemon is still the parent


def model_kind(metadata: dict[str, str], path: str) -> str:
    """instruct | base | unknown, from what the GGUF says (general.finetune, general.name,
    general.basename) and its file name. A base model continues text: it copies the prompt's
    examples instead of following the instructions, so clagd refuses it."""
    said = [metadata.get(k, "") for k in ("general.finetune", "general.name", "general.basename")]
    said.append(os.path.basename(path))
    if any(_INSTRUCT.search(x) for x in said if x):
        return "instruct"
    if any(_BASE.search(x) for x in said if x):
        return "base"
    return "unknown"


@dataclass
class _State:
    """The worker's model, once `load` made it, and the chat formatter of its GGUF's
    template (None: llama-cpp-python's `chat_format`)."""

    llm: Any = None
    formatter: Any = None


def _load(state: _State, req: dict[str, Any]) -> dict[str, Any]:
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    start = time.monotonic()
    chat_format = req.get("chat_format") or None
    llm = Llama(
        model_path=req["model_path"],
        n_ctx=int(req.get("n_ctx", 2048)),
        n_threads=int(req.get("n_threads", 2)),
        seed=int(req.get("seed", 42)),
        chat_format=chat_format,
        verbose=False,
    )
    meta = {str(k): str(v) for k, v in (llm.metadata or {}).items()}
    template = meta.get("tokenizer.chat_template", "")
    kind = model_kind(meta, req["model_path"])
    name = os.path.basename(req["model_path"])
    if not template and not chat_format:
        # llama-cpp-python would silently use the llama-2 format ("[/INST]" leaks into plans)
        return {
            "ok": False,
            "error": f"{name} has no chat template (tokenizer.chat_template); "
            "set backend.llamacpp.chat_format if you know the model's format",
        }
    if kind == "base" or (kind == "unknown" and not template):
        return {
            "ok": False,
            "error": f"{name} is a base model, not instruction-tuned "
            f"(GGUF general.finetune={meta.get('general.finetune', '')!r}, "
            f"general.name={meta.get('general.name', '')!r}); use an instruct GGUF",
        }
    state.llm = llm
    if template:
        eos = llm._model.token_get_text(llm.token_eos()) if llm.token_eos() >= 0 else ""
        bos = llm._model.token_get_text(llm.token_bos()) if llm.token_bos() >= 0 else ""
        state.formatter = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)
    return {
        "ok": True,
        "seconds": time.monotonic() - start,
        "kind": kind,
        "chat_template": "gguf" if template and not chat_format else str(chat_format),
        "n_ctx": llm.n_ctx(),
    }


def _count(state: _State, messages: list[dict[str, str]]) -> int:
    """The prompt in the model's own tokens: the chat template applied, then tokenized."""
    llm = state.llm
    formatter = state.formatter
    if formatter is not None:
        try:
            prompt = formatter(messages=messages).prompt
            return len(llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True))
        except Exception:  # noqa: BLE001 - an odd template: count the messages one by one
            pass
    return sum(
        len(llm.tokenize(str(m.get("content", "")).encode("utf-8"), add_bos=False))
        + MESSAGE_OVERHEAD
        for m in messages
    )


def _chat(state: _State, req: dict[str, Any]) -> dict[str, Any]:
    llm = state.llm
    n_ctx = int(llm.n_ctx())
    prompt_tokens = _count(state, req["messages"])
    room = n_ctx - prompt_tokens
    if room < 16:
        return {
            "ok": False,
            "error": f"the prompt ({prompt_tokens:,} tokens) leaves no room for an answer in "
            f"the context window (n_ctx={n_ctx:,})",
            "prompt_tokens": prompt_tokens,
        }
    out = llm.create_chat_completion(
        messages=req["messages"],
        response_format={"type": "json_object", "schema": req["schema"]},
        temperature=float(req.get("temperature", 0.1)),
        seed=req.get("seed"),
        max_tokens=min(int(req.get("max_tokens", 768)), room),
    )
    choice = out["choices"][0]
    usage = out.get("usage") or {}
    return {
        "ok": True,
        "content": choice["message"].get("content") or "",
        "finish_reason": choice.get("finish_reason"),
        "prompt_tokens": int(usage.get("prompt_tokens", prompt_tokens)),
        "completion_tokens": int(usage.get("completion_tokens", 0)),
        "n_ctx": n_ctx,
    }


def _handle(state: _State, req: dict[str, Any]) -> dict[str, Any]:
    op = req.get("op")
    if op == "ping":
        return {"ok": True, "pid": os.getpid()}
    if op == "load":
        return _load(state, req)
    if op in ("chat", "count") and state.llm is None:
        return {"ok": False, "error": "no model loaded"}
    if op == "count":
        return {"ok": True, "tokens": _count(state, req["messages"])}
    if op == "chat":
        return _chat(state, req)
    if os.environ.get("CLAGD_WORKER_TEST_OPS") == "1":
        # Failure injection for tests: a native crash and a hang, without a model.
        if op == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if op == "hang":
            time.sleep(3600)
    return {"ok": False, "error": f"unknown op {op!r}"}


def _exit_when_orphaned(parent: int) -> None:
    """Exit as soon as the daemon is gone (killed, or its overdue stop's `os._exit`): the
    end of stdin is read only between requests, so an answer being made would otherwise
    run to its end (minutes) with nobody to hear it. llama.cpp's calls let this thread run."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL)
    os._exit(0)


def main() -> None:
    # the daemon's pid as the daemon gave it: one that died before this line is noticed too
    parent = int(os.environ.get("CLAGD_WORKER_PARENT") or os.getppid())
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    state = _State()
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
