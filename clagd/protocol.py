"""The socket protocol's shared ground, used by both sides: where the socket of a store is,
the wire limits, the shape of an error reply and the parameters of `query`.

Socket resolution (one order, everywhere: the CLI, `Client.for_store`, `clagd mcp`, the
daemon and the systemd units):
  1. an explicit path (`--socket`), else `$CLAGD_SOCKET`;
  2. `server.socket` from the store's `clagd.yaml` (relative: to the store);
  3. the default: `<store>/.clagd/clagd.sock` when it fits in an AF_UNIX address, else a
     short name derived from the store's path in the owner's private runtime directory,
     `/run/user/<uid>/clagd/` or `~/.clagd/run/` (`private_runtime_dir`: chosen from the
     uid alone, so every environment finds the same one; never a folder in /tmp).
The store itself is `--store`, else `$CLAGD_STORE`, else `./memory`.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import socket
import stat
import struct
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import Field, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from clagd import errors
from clagd.config import load_config
from clagd.model import parse_time
from clagd.scopes import check_scopes, scope_or_default

# sun_path holds 108 bytes on Linux and 104 on the BSDs and macOS, the final NUL included:
# the longest socket path that can be bound is one byte less.
SUN_PATH_SIZE = 108 if sys.platform.startswith("linux") else 104
MAX_SOCKET_PATH = SUN_PATH_SIZE - 1
MAX_REPLY_BYTES = 256 * 1024 * 1024
DEFAULT_STORE = "./memory"
STORE_ENV = "CLAGD_STORE"
SOCKET_ENV = "CLAGD_SOCKET"
# ops that may be sent again after the connection dropped before their reply
IDEMPOTENT_OPS = frozenset({"ping", "status", "query", "get", "list", "clusters", "log"})
_UNSAFE_NAME_RE = re.compile(r"[^A-Za-z0-9._-]+")
# logind's per-user runtime directories: /run/user is writable by root alone
RUNTIME_ROOT = Path("/run/user")


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
    return default_socket_path(root) if binding else find_socket_path(root)


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


def _private_to(path: Path, uid: int) -> bool:
    """`path` is a directory owned by `uid` (or root) that no one else may write into."""
    try:
        st = path.stat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid in (uid, 0) and not st.st_mode & 0o022


def _home_of(uid: int) -> Path | None:
    try:
        return Path(pwd.getpwuid(uid).pw_dir)
    except KeyError:
        return None


def private_runtime_dir(uid: int | None = None, runtime_root: Path = RUNTIME_ROOT) -> Path | None:
    """Where the fallback sockets of `uid` live: `/run/user/<uid>/clagd` when that runtime
    directory (made by logind, in a folder only root writes) is owned by `uid` and closed to
    others, else `<home>/.clagd/run` when the home directory is; None when neither is.

    Chosen from the uid alone, never from the environment: a client without
    `$XDG_RUNTIME_DIR` (cron, sudo) finds the socket the daemon bound, and no folder that
    another user could create first (`/tmp/clagd-<uid>`) is ever used.
    """
    uid = os.getuid() if uid is None else uid
    if _private_to(runtime_root / str(uid), uid):
        return runtime_root / str(uid) / "clagd"
    home = _home_of(uid)
    if home is not None and home.is_absolute() and _private_to(home, uid):
        return home / ".clagd" / "run"
    return None


def store_owner(store: str | os.PathLike[str]) -> int:
    """The uid a daemon serving `store` runs as: the store's owner (ours when unreadable)."""
    try:
        return os.stat(store).st_uid
    except OSError:
        return os.getuid()


def socket_path_candidates(store: str | os.PathLike[str]) -> list[Path]:
    """Where the default socket of `store` may live, preferred first.

    `<store>/.clagd/clagd.sock` when it fits in an AF_UNIX address; otherwise a short name
    derived from a hash of the store's absolute path in the private runtime directory
    (`private_runtime_dir`) of the store's owner, then in ours (a daemon binds in its own).
    """
    root = Path(store).expanduser().resolve()
    preferred = root / ".clagd" / "clagd.sock"
    if fits_af_unix(preferred):
        return [preferred]
    name = _short_name(root)
    out: list[Path] = []
    for uid in dict.fromkeys((store_owner(root), os.getuid())):
        directory = private_runtime_dir(uid)
        if directory is not None and fits_af_unix(directory / name):
            out.append(directory / name)
    if not out:
        raise errors.StoreError(
            f"{preferred}: too long for a socket ({len(os.fsencode(str(preferred)))} bytes, at "
            f"most {MAX_SOCKET_PATH}), and no private runtime directory to put one in "
            f"({RUNTIME_ROOT}/{os.getuid()} or a home directory closed to others): set "
            "server.socket in clagd.yaml to a path in a private directory"
        )
    return out


def fits_af_unix(path: str | os.PathLike[str]) -> bool:
    return len(os.fsencode(str(path))) <= MAX_SOCKET_PATH


def default_socket_path(store: str | os.PathLike[str]) -> Path:
    """The default socket path a daemon of our uid binds for `store` (deterministic)."""
    candidates = socket_path_candidates(store)
    ours = private_runtime_dir()
    mine = [p for p in candidates if ours is not None and p.parent == ours]
    return (mine or candidates)[0]


def find_socket_path(store: str | os.PathLike[str]) -> Path:
    """The default candidate that exists, else the first: what a client connects to."""
    candidates = socket_path_candidates(store)
    for path in candidates:
        if path.exists():
            return path
    return candidates[0]


def prepare_socket_dir(path: str | os.PathLike[str]) -> None:
    """Create the socket's directory (mode 0700) before binding; refuse an unsafe one.

    The store's `.clagd/`, our private runtime directory and any directory created here
    are made 0700. Any other directory (a configured `server.socket`, `--socket`) must
    belong to us (or root) and be closed to writes by others, the sticky `/tmp` included:
    there another user could plant a socket, or replace ours, and answer for clagd.
    """
    directory = Path(path).parent
    created = not directory.exists()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = directory.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise errors.StoreError(f"{directory}: not a directory (socket directory)")
    if directory.name == ".clagd":
        return
    if st.st_uid not in (os.getuid(), 0):
        raise errors.StoreError(
            f"{directory}: owned by {user_name(st.st_uid)}, not by us; "
            "refusing to put the socket there (another user could answer for clagd)"
        )
    if created or directory == private_runtime_dir():
        if st.st_mode & 0o077:
            os.chmod(directory, 0o700)
        return
    if st.st_mode & 0o022:
        raise errors.StoreError(
            f"{directory}: other users may write there (and plant or replace the socket); "
            "choose a private directory for server.socket"
        )


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a connected Unix socket (SO_PEERCRED;
    None where the platform has none)."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def user_name(uid: int) -> str:
    """`uid 1001 (eve)`: a uid as messages name it."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


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

# a metadata filter: (key, value as `scalar_text` gives it) pairs, sorted by key; every
# pair must hold (ANDed). Empty: no filter.
Where = tuple[tuple[str, str], ...]
MAX_WHERE_KEYS = 32


def scalar_text(value: object) -> str | None:
    """What a filter compares: the text of a scalar metadata value (`true`, `false`, `null`,
    a number as written, a string itself); None for a list or a mapping, which no filter
    matches. A float with no fraction is its integer (`1.0` is `1`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value
    return None


def flag(params: Mapping[str, Any], key: str, default: bool = False) -> bool:
    """A boolean parameter: a real JSON boolean, or absent (or null: the default). A loose
    one (`"false"`, `0`, `"no"`) is refused naming what was sent, never taken for true."""
    value = params.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise errors.BadRequest(
            f"{key!r} must be true or false (a JSON boolean), not {value!r}"[:300]
        )
    return value


def check_where(raw: object) -> Where:
    """A request's `where` (an object of metadata key -> scalar), checked: BadRequest names
    the key or value that is wrong."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise errors.BadRequest(
            f"'where' must be an object of metadata key -> value, got {type(raw).__name__}"
        )
    if len(raw) > MAX_WHERE_KEYS:
        raise errors.BadRequest(f"'where' has {len(raw)} keys, at most {MAX_WHERE_KEYS}")
    out = []
    for key, value in raw.items():
        if not isinstance(key, str) or not key.strip():
            raise errors.BadRequest(f"'where': key {key!r} must be a non-empty string")
        text = scalar_text(value)
        if text is None:
            raise errors.BadRequest(
                f"'where': {key!r} must be a string, number, boolean or null, "
                f"got {type(value).__name__} (filters match scalar metadata only)"
            )
        out.append((key, text))
    return tuple(sorted(out))


def parse_where(args: Iterable[str]) -> dict[str, str]:
    """`KEY=VALUE` arguments (the CLI's `--where`) as a `where` object; BadRequest names the
    argument that has no `=` or an empty key. A key given twice keeps its last value."""
    out: dict[str, str] = {}
    for arg in args:
        key, eq, value = arg.partition("=")
        if not eq or not key.strip():
            raise errors.BadRequest(f"--where {arg!r}: expected KEY=VALUE (e.g. source=chat)")
        out[key.strip()] = value
    return out


def where_matches(metadata: Mapping[str, object], where: Where) -> bool:
    """Whether a memory's metadata holds every (key, value) of `where`."""
    for key, text in where:
        if key not in metadata or scalar_text(metadata[key]) != text:
            return False
    return True


@dataclass(frozen=True)
class QueryParams:
    """The parameters of `query`, as the client sends them and the engine checks them."""

    text: str
    max_memories: int | None = None  # None: the configured retrieval.max_memories
    token_budget: int | None = None  # None: the configured budget; 0: no budget
    include_archive: bool = False
    where: Where = ()  # metadata filter, applied inside retrieval (before the cut)
    scope: str | None = None  # None: the default scope
    scopes: tuple[str, ...] = ()  # more scopes the query sees, named explicitly
    superseded: bool = False  # memories another supersedes are searched too

    @classmethod
    def from_request(cls, params: Mapping[str, Any]) -> QueryParams:
        """From a request's parameters (unknown keys are ignored), checked."""
        return cls(
            text=params.get("text", ""),  # any type: check() says what is wrong
            max_memories=params.get("max_memories"),
            token_budget=params.get("token_budget"),
            include_archive=flag(params, "include_archive"),
            where=check_where(params.get("where")),
            scope=params.get("scope"),
            scopes=extra_scopes(params),
            superseded=flag(params, "superseded"),
        ).check()

    def visible(self) -> frozenset[str]:
        """The scopes this query sees: its scope and the ones it names."""
        return frozenset((scope_or_default(self.scope), *self.scopes))

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
        scope_or_default(self.scope)
        check_scopes(self.scopes)
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
        if self.where:
            out["where"] = dict(self.where)
        if self.scope is not None:
            out["scope"] = self.scope
        if self.scopes:
            out["scopes"] = list(self.scopes)
        if self.superseded:
            out["superseded"] = True
        return out


# --------------------------------------------------------------------------- list


def extra_scopes(params: Mapping[str, Any]) -> tuple[str, ...]:
    """A request's `scopes` (more scopes it sees besides its `scope`), unchecked names."""
    extra = params.get("scopes") or ()
    if not isinstance(extra, (list, tuple)):
        raise errors.BadRequest("'scopes' must be a list of scope names")
    return tuple(extra)


def request_scopes(params: Mapping[str, Any]) -> frozenset[str]:
    """The scopes a request sees: its `scope` (the default when left out) and `scopes`,
    checked (`errors.BadScope` names a bad one)."""
    return frozenset((scope_or_default(params.get("scope")), *check_scopes(extra_scopes(params))))


DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 10_000
_AGE_RE = re.compile(r"^\s*(\d{1,9})\s*([smhdw])\s*$")
_AGE_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
SINCE_FORMS = "an ISO 8601 time (2026-01-31, 2026-01-31T12:00:00Z) or an age (30m, 2h, 7d, 4w)"


def since_epoch(text: str, now: float) -> float:
    """`since` as epoch seconds: an ISO 8601 time (naive: UTC), or an age before `now`
    (`90s`, `30m`, `2h`, `7d`, `4w`). BadRequest names the text that is neither."""
    age = _AGE_RE.match(text)
    if age:
        return now - int(age.group(1)) * _AGE_SECONDS[age.group(2)]
    dt = parse_time(text.strip())
    if dt is None:
        raise errors.BadRequest(f"'since' {text!r} is not {SINCE_FORMS}")
    try:
        return dt.timestamp()
    except (OverflowError, ValueError):
        raise errors.BadRequest(f"'since' {text!r} is out of range") from None


@dataclass(frozen=True)
class ListParams:
    """The parameters of `list`: the memories a filter lets through, newest first."""

    where: Where = ()
    since: str | None = None  # an ISO 8601 time or an age (`since_epoch`)
    limit: int = DEFAULT_LIST_LIMIT
    include_archive: bool = False
    scope: str | None = None  # None: the default scope
    scopes: tuple[str, ...] = ()  # more scopes listed, named explicitly
    superseded: bool = False  # memories another supersedes are listed too

    @classmethod
    def from_request(cls, params: Mapping[str, Any]) -> ListParams:
        """From a request's parameters (unknown keys are ignored), checked."""
        return cls(
            where=check_where(params.get("where")),
            since=params.get("since"),
            limit=params.get("limit", DEFAULT_LIST_LIMIT),
            include_archive=flag(params, "include_archive"),
            scope=params.get("scope"),
            scopes=extra_scopes(params),
            superseded=flag(params, "superseded"),
        ).check()

    def visible(self) -> frozenset[str]:
        """The scopes listed: the scope and the ones named besides."""
        return frozenset((scope_or_default(self.scope), *check_scopes(self.scopes)))

    def check(self) -> ListParams:
        """Raise BadRequest naming the first bad parameter."""
        if self.since is not None:
            if not isinstance(self.since, str):
                raise errors.BadRequest(f"'since' must be a string: {SINCE_FORMS}")
            since_epoch(self.since, 0.0)
        n = self.limit
        if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= MAX_LIST_LIMIT:
            raise errors.BadRequest(f"'limit' must be an integer from 1 to {MAX_LIST_LIMIT}")
        self.visible()
        return self

    def to_request(self) -> dict[str, Any]:
        """The request parameters: defaults left out."""
        out: dict[str, Any] = {"limit": self.limit}
        if self.where:
            out["where"] = dict(self.where)
        if self.since is not None:
            out["since"] = self.since
        if self.include_archive:
            out["include_archive"] = True
        if self.scope is not None:
            out["scope"] = self.scope
        if self.scopes:
            out["scopes"] = list(self.scopes)
        return out
