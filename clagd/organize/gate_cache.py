"""Where the competence gate's verdicts are kept beyond one store: the user's cache
(`$XDG_CACHE_HOME/clagd/gate/`), keyed by what the model is (its GGUF's sha256 when the
backend loads a file), so a second store does not measure the same model again."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from clagd.slm.base import Backend


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(path)


def user_gate_dir(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_CACHE_HOME/clagd/gate` (default `~/.cache/clagd/gate`): verdicts by model file,
    shared by every store of the user."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clagd" / "gate"


_FILE_HASHES: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """The file's sha256, remembered per (path, size, mtime) in this process and in the
    user cache (hashing a 1.1 GB GGUF takes seconds)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key in _FILE_HASHES:
        return _FILE_HASHES[key]
    memo = user_gate_dir() / "files.json"
    try:
        known = json.loads(memo.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    entry = known.get(key[0]) if isinstance(known, dict) else None
    if isinstance(entry, dict) and [entry.get("size"), entry.get("mtime_ns")] == list(key[1:]):
        digest = str(entry.get("sha256"))
    else:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        digest = h.hexdigest()
        known = known if isinstance(known, dict) else {}
        known[key[0]] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
        write_json(memo, known)
    _FILE_HASHES[key] = digest
    return digest


def model_identity(backend: Backend) -> str:
    """What the user-wide cache knows a model by: the sha256 of its file when the backend
    loads one (llama.cpp), else its backend, name and server."""
    path = getattr(backend, "model_path", "") or ""
    if path and Path(path).is_file():
        return f"file:{file_sha256(Path(path))}"
    return f"{backend.name}:{backend.model}:{getattr(backend, 'host', '') or ''}"
