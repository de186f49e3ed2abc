"""The socket protocol's shared ground, used by both sides: where the socket of a store is,
the wire limits, the shape of an error reply and the parameters of `query`.

Socket resolution (one order, everywhere: the CLI, `Client.for_store`, `clagd mcp`, the
daemon and the systemd units):
  1. an explicit path (`--socket`), else `$CLAGD_SOCKET`;
  2. `server.socket` from the store's `clagd.yaml` (relative: to the store);
  3. the default: `<store>/.clagd/clagd.sock` when it fits in an AF_UNIX address, else a
     short name derived from the store's path under `$XDG_RUNTIME_DIR/clagd/` or
     `/tmp/clagd-<uid>/` (a client looks for the one that exists).
The store itself is `--store`, else `$CLAGD_STORE`, else `./memory`.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from clagd import errors
from clagd.config import load_config

# sun_path holds 108 bytes on Linux and 104 on the BSDs and macOS, the final NUL included:
# the longest socket path that can be bound is one byte less.
SUN_PATH_SIZE = 108 if sys.platform.startswith("linux") else 104
MAX_SOCKET_PATH = SUN_PATH_SIZE - 1
MAX_REPLY_BYTES = 256 * 1024 * 1024
DEFAULT_STORE = "./memory"
STORE_ENV = "CLAGD_STORE"
SOCKET_ENV = "CLAGD_SOCKET"
# ops that may be sent again after the connection dropped before their reply
IDEMPOTENT_OPS = frozenset({"ping", "status", "query", "clusters", "log"})
_UNSAFE_NAME_RE = re.compile(r"[^A-Za-z0-9._-]+")


# --------------------------------------------------------------------------- the store


def store_path(
    explicit: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Path:
    """The store a command works on: `explicit`, else $CLAGD_STORE, else ./memory."""
    env = os.environ if env is None else env
    return Path(explicit or env.get(STORE_ENV) or DEFAULT_STORE)


# --------------------------------------------------------------------------- the socket


def resolve_socket(
    store: str | os.PathLike[str],
    explicit: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    configured: str | None = None,
    binding: bool = False,
) -> Path:
    """The socket of `store`, in the order the module docstring gives.

    `configured` is `server.socket` when the caller has the config already (the daemon);
    otherwise it is read from the store's clagd.yaml. `binding`: the path to bind (the
    default candidate) rather than the one to connect to (the candidate that exists).
    """
    env = os.environ if env is None else env
    chosen = explicit or env.get(SOCKET_ENV)
    if chosen:
        return Path(chosen).expanduser().absolute()  # a path given on the command line: from cwd
    root = Path(store).expanduser().resolve()
    if configured is None:
        configured = configured_socket(root)
    if configured:
        p = Path(configured).expanduser()
        return p if p.is_absolute() else root / p
    return default_socket_path(root, env) if binding else find_socket_path(root, env)


def configured_socket(store: Path) -> str:
    """`server.socket` from the store's clagd.yaml ("" when unset or unreadable: a client
    then tries the default; the daemon itself refuses to start on a broken config and says
    why)."""
    if not (store / "clagd.yaml").exists():
        return ""
    try:
        return load_config(store, env={}).server.socket
    except errors.ConfigError:
        return ""


def _short_name(store: Path) -> str:
    digest = hashlib.sha256(os.fsencode(str(store))).hexdigest()[:16]
    name = _UNSAFE_NAME_RE.sub("_", store.name)[:24].strip("._-") or "store"
    return f"{name}-{digest}.sock"


def socket_path_candidates(
    store: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> list[Path]:
    """Where the default socket of `store` may live, preferred first.

    `<store>/.clagd/clagd.sock` when it fits in an AF_UNIX address; otherwise a short name
    derived from a hash of the store's absolute path, under `$XDG_RUNTIME_DIR/clagd/` (when
    set) and then `/tmp/clagd-<uid>/`. Both fallbacks are listed because a client and a
    server started from different environments (cron, sudo, a systemd unit with PrivateTmp)
    may disagree on `$XDG_RUNTIME_DIR`.
    """
    env = os.environ if env is None else env
    root = Path(store).expanduser().resolve()
    preferred = root / ".clagd" / "clagd.sock"
    if fits_af_unix(preferred):
        return [preferred]
    name = _short_name(root)
    out = []
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        out.append(Path(runtime) / "clagd" / name)
    out.append(Path(f"/tmp/clagd-{os.getuid()}") / name)
    return out


def fits_af_unix(path: str | os.PathLike[str]) -> bool:
    return len(os.fsencode(str(path))) <= MAX_SOCKET_PATH


def default_socket_path(
    store: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> Path:
    """The default socket path a daemon serving `store` binds (deterministic for an env)."""
    return socket_path_candidates(store, env)[0]


def find_socket_path(store: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Path:
    """The default candidate that exists, else the first: what a client connects to."""
    candidates = socket_path_candidates(store, env)
    for path in candidates:
        if path.exists():
            return path
    return candidates[0]


def prepare_socket_dir(path: str | os.PathLike[str]) -> None:
    """Create the socket's directory (mode 0700) before binding; refuse a foreign one.

    Only a directory clagd owns is ever chmodded: the store's `.clagd/`, one it creates
    here, or its own fallbacks (`/tmp/clagd-<uid>`, `$XDG_RUNTIME_DIR/clagd`), which must
    belong to us and not be open to others, or another user could plant a socket. A
    configured socket in any other directory (`server.socket: ../x.sock`) leaves that
    directory's mode alone; one that others may write into without the sticky bit (they
    could replace the socket) is refused.
    """
    directory = Path(path).parent
    created = not directory.exists()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = directory.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise errors.StoreError(f"{directory}: not a directory (socket directory)")
    if directory.name == ".clagd":
        return
    ours = created or directory.name == "clagd" or directory.name.startswith("clagd-")
    if st.st_uid != os.getuid() and ours:
        raise errors.StoreError(
            f"{directory}: owned by uid {st.st_uid}, not by us; refusing to put the socket there"
        )
    if ours:
        if st.st_mode & 0o077:
            os.chmod(directory, 0o700)
        return
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise errors.StoreError(
            f"{directory}: other users may write there (and replace the socket); "
            "choose a private directory for server.socket"
        )


# --------------------------------------------------------------------------- replies


def ok_reply(rid: Any, result: object) -> dict[str, Any]:
    """A result reply: `result` (an operation's dataclass, or plain data) as JSON values."""
    return {"id": rid, "ok": True, "result": to_wire(result)}


# the metadata of a result dataclass's field that the reply leaves out while it is None
OMIT_NONE: Mapping[str, object] = {"wire": "omit_none"}


_SCALARS = frozenset({str, int, float, bool, type(None)})
# field annotations whose values go on the wire as they are
_SCALAR_TYPES = frozenset(
    {"str", "int", "float", "bool", "str | None", "int | None", "float | None", "bool | None"}
)


def _converter(cls: type) -> Callable[[object], dict[str, object]] | None:
    """The function that makes dataclass `cls` a JSON object (None: `cls` is no dataclass),
    compiled once per class as dataclasses compiles `__init__`: scalar fields are copied,
    the others go through `to_wire`; an `OMIT_NONE` field is left out while None."""
    if not is_dataclass(cls):
        return None
    found: tuple[Field[object], ...] = fields(cls)
    lines = ["def convert(o):", "    out = {"]
    later = []
    for f in found:
        value = f"o.{f.name}" if str(f.type) in _SCALAR_TYPES else f"to_wire(o.{f.name})"
        if f.metadata.get("wire") == "omit_none":
            later.append(f"    if o.{f.name} is not None: out[{f.name!r}] = {value}")
        else:
            lines.append(f"        {f.name!r}: {value},")
    lines += ["    }", *later, "    return out"]
    scope: dict[str, object] = {"to_wire": to_wire}
    exec("\n".join(lines), scope)  # noqa: S102 - our own field names, as dataclasses does
    convert: Callable[[object], dict[str, object]] = scope["convert"]  # type: ignore[assignment]
    return convert


# each class's converter (None: not a dataclass), made on first use
_CONVERTERS: dict[type, Callable[[object], dict[str, object]] | None] = {}


def to_wire(obj: object) -> object:
    """What a result is on the wire (the one place the engine's typed results become JSON
    values): a dataclass is an object of its fields in their order (one whose metadata is
    `OMIT_NONE` left out while None), a tuple or list an array, a mapping an object."""
    kind: type = type(obj)
    if kind in _SCALARS:
        return obj
    if isinstance(obj, (list, tuple)):
        return [v if type(v) in _SCALARS else to_wire(v) for v in obj]
    if kind in _CONVERTERS:
        convert = _CONVERTERS[kind]
    else:
        convert = _CONVERTERS[kind] = _converter(kind)
    if convert is not None:
        return convert(obj)
    if isinstance(obj, Mapping):
        return {k: v if type(v) in _SCALARS else to_wire(v) for k, v in obj.items()}
    return obj


def error_reply(rid: Any, code: str, message: str) -> dict[str, Any]:
    """The one shape of an error reply. `rid` None: a refusal of the connection or of a line
    that was no request (forbidden, busy, too_large, bad_json)."""
    return {"id": rid, "ok": False, "error": {"code": code, "message": message}}


# --------------------------------------------------------------------------- query


MAX_MEMORIES_LIMIT = 100


@dataclass(frozen=True)
class QueryParams:
    """The parameters of `query`, as the client sends them and the engine checks them."""

    text: str
    max_memories: int | None = None  # None: the configured retrieval.max_memories
    token_budget: int | None = None  # None: the configured budget; 0: no budget
    include_archive: bool = False

    @classmethod
    def from_request(cls, params: Mapping[str, Any]) -> QueryParams:
        """From a request's parameters (unknown keys are ignored), checked."""
        return cls(
            text=params.get("text", ""),  # any type: check() says what is wrong
            max_memories=params.get("max_memories"),
            token_budget=params.get("token_budget"),
            include_archive=bool(params.get("include_archive", False)),
        ).check()

    def check(self) -> QueryParams:
        """Raise BadRequest naming the first bad parameter."""
        if not isinstance(self.text, str) or not self.text.strip():
            raise errors.BadRequest("'text' must be a non-empty string")
        m = self.max_memories
        if m is not None and (
            not isinstance(m, int) or isinstance(m, bool) or not 0 < m <= MAX_MEMORIES_LIMIT
        ):
            raise errors.BadRequest(
                f"'max_memories' must be an integer from 1 to {MAX_MEMORIES_LIMIT}"
            )
        b = self.token_budget
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 0):
            raise errors.BadRequest("'token_budget' must be a non-negative integer")
        return self

    def to_request(self) -> dict[str, Any]:
        """The request parameters: None and False are left out (the daemon's defaults)."""
        out: dict[str, Any] = {"text": self.text}
        if self.max_memories is not None:
            out["max_memories"] = self.max_memories
        if self.token_budget is not None:
            out["token_budget"] = self.token_budget
        if self.include_archive:
            out["include_archive"] = True
        return out
