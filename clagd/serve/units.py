"""systemd unit files for clagd: rendered for one store (`clagd install-service`) or generic.

A wheel cannot install units, so `install_service` writes them where systemd looks
(`~/.config/systemd/user/` or `/etc/systemd/system/`) and returns the `systemctl` command to
run next. The generic units shipped in `systemd/` come from the same renderer
(`python -m clagd.serve.units --write-static systemd/`), so both stay in step.

Hardening notes, kept here because they decide what a unit may contain:
- `RestrictAddressFamilies` allows AF_INET/AF_INET6 because the `ollama` backend speaks HTTP
  (and replication may push over the network); with backend `none` or `llamacpp` and no
  remote, AF_UNIX alone is enough.
- `MemoryDenyWriteExecute` is off by default: llama.cpp, and libffi closures in ctypes on
  some systems, need memory that is writable and then executable. Turn it on
  (`deny_write_execute=True`) for the `ollama`/`none` backends.
- `ProtectHome=read-only` plus `ReadWritePaths=<store>` lets a store live in a home directory.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from clagd.errors import ClagdError
from clagd.protocol import RUNTIME_ROOT, resolve_socket

__all__ = [
    "EX_CONFIG",
    "SYSTEM_SOCKET_DIR",
    "UNIT_PREFIX",
    "UnitPlan",
    "default_exe",
    "install_service",
    "install_service_command",
    "render_static_units",
    "render_unit",
    "sandbox_problems",
    "service_unit",
    "unit_name",
]

UNIT_PREFIX = "clagd-"  # install-service names a store's units clagd-<store folder name>
SYSTEM_SOCKET_DIR = Path("/run/clagd")  # system units listen on <this>/<name>.sock
EX_CONFIG = 78  # sysexits.h; the daemon exits with it on a bad config: no restart loop
WATCHDOG_SEC = 60
_UNSAFE_NAME_RE = re.compile(r"[^A-Za-z0-9:_.-]+")


# --------------------------------------------------------------------------- quoting


def _escape(value: str) -> str:
    """A literal for a unit file: no specifier (%) expansion, no newlines."""
    if "\n" in value or "\r" in value:
        raise ClagdError(
            f"a path in a unit file cannot contain a newline: {value!r}", "bad_request"
        )
    return value.replace("%", "%%")


def _quote(value: str, dollar: bool = True) -> str:
    """One ExecStart= (or, with dollar=False, Environment=/ReadWritePaths=) word.

    ExecStart= expands `$VAR`, so a literal `$` is `$$` there; the other settings do not.
    """
    value = _escape(value).replace("\\", "\\\\").replace('"', '\\"')
    if dollar:
        value = value.replace("$", "$$")
    return f'"{value}"' if re.search(r'[\s"\'\\;]', value) or not value else value


def _path_list_item(value: str) -> str:
    return _quote(value, dollar=False)


# --------------------------------------------------------------------------- rendering


def unit_name(store: str | os.PathLike[str]) -> str:
    """`clagd-<store directory name>`: the unit name of a store's daemon."""
    base = _UNSAFE_NAME_RE.sub("-", Path(store).expanduser().resolve().name).strip("-.")
    return f"{UNIT_PREFIX}{base or 'store'}"


def service_unit(store: str | os.PathLike[str]) -> str:
    """The service `clagd install-service` writes for `store` (what to `systemctl start`)."""
    return f"{unit_name(store)}.service"


def default_exe() -> list[str]:
    """How systemd should start clagd: the `clagd` script of this installation if there is
    one (a venv's `bin/`, or PATH), else this interpreter with `-m clagd`."""
    beside = Path(sys.executable).with_name("clagd")
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("clagd")
    if found:
        return [str(Path(found).resolve())]
    return [sys.executable, "-m", "clagd"]


def _service(
    *,
    description: str,
    exec_start: str,
    store: str,
    socket_env: str,  # the Environment= value setting CLAGD_SOCKET, already quoted
    user: bool,
    socket_unit: str | None,
    extra_service: Sequence[str] = (),
    protect_home: str = "read-only",
    deny_write_execute: bool = False,
    watchdog_sec: int = WATCHDOG_SEC,
) -> str:
    unit = ["# How to install and run: docs/service.md in the clagd sources.", "[Unit]"]
    unit.append(f"Description={description}")
    if socket_unit:
        unit += [f"Requires={socket_unit}", f"After={socket_unit}"]
    if not user:
        unit += ["After=network.target"]
    svc = [
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={exec_start}",
        "ExecReload=/bin/kill -HUP $MAINPID",  # clagd.yaml read again (not a restart)
        f"Environment={socket_env}",
        "Environment=PYTHONUNBUFFERED=1",
        *extra_service,
        f"WatchdogSec={watchdog_sec}",
        "TimeoutStartSec=300",
        "TimeoutStopSec=60",
        "Restart=on-failure",
        "RestartSec=2",
        f"RestartPreventExitStatus={EX_CONFIG}",
        "KillSignal=SIGTERM",
        "KillMode=mixed",
        "UMask=0077",
        "",
        "# Hardening (see docs/service.md)",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        f"ProtectHome={protect_home}",
        f"ReadWritePaths={store}",
        "PrivateTmp=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "LockPersonality=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "SystemCallArchitectures=native",
    ]
    if not user:
        svc += [
            "PrivateDevices=yes",
            "ProtectKernelTunables=yes",
            "ProtectKernelModules=yes",
            "ProtectKernelLogs=yes",
            "ProtectControlGroups=yes",
            "ProtectClock=yes",
            "ProtectHostname=yes",
            "RestrictNamespaces=yes",
            "CapabilityBoundingSet=",
            "SystemCallFilter=@system-service",
        ]
    if deny_write_execute:
        svc.append("MemoryDenyWriteExecute=yes")
    else:
        svc.append("# MemoryDenyWriteExecute=yes breaks llama.cpp (the llamacpp backend); safe")
        svc.append("# with the ollama and none backends.")
    install = ["", "[Install]", f"WantedBy={'default.target' if user else 'multi-user.target'}"]
    return "\n".join(unit + svc + install) + "\n"


def _socket(*, description: str, listen: str, user: bool, socket_user: str | None = None) -> str:
    lines = ["[Unit]", f"Description={description}", "", "[Socket]", f"ListenStream={listen}"]
    if user or not socket_user:
        lines += ["SocketMode=0600", "DirectoryMode=0700"]
    else:
        lines += [
            f"SocketUser={socket_user}",
            f"SocketGroup={socket_user}",
            "SocketMode=0660",
            "DirectoryMode=0755",
        ]
    lines += ["Accept=no", "", "[Install]", "WantedBy=sockets.target"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class UnitPlan:
    """What a store's units are made of: decided once, then rendered and checked."""

    root: Path
    name: str
    argv: list[str]
    socket: Path
    user: bool


def plan_unit(
    store: str | os.PathLike[str],
    user: bool = True,
    exe: str | Sequence[str] | None = None,
    name: str | None = None,
    socket_path: str | os.PathLike[str] | None = None,
) -> UnitPlan:
    """The store, unit name, command and socket of the units `render_unit` writes.

    User units bind the store's socket (`protocol.resolve_socket`: its clagd.yaml's
    `server.socket`, else the default; what `clagd --store` finds on its own); system units
    listen on `/run/clagd/<name>.sock`.
    """
    root = Path(store).expanduser().resolve()
    name = name or unit_name(root)
    argv = [exe] if isinstance(exe, str) else list(exe or default_exe())
    if socket_path is None:
        if user:
            socket_path = resolve_socket(root, env={}, binding=True)
        else:
            socket_path = SYSTEM_SOCKET_DIR / f"{name.removeprefix(UNIT_PREFIX)}.sock"
    return UnitPlan(root, name, argv, Path(socket_path), user)


def _socket_dir_settings(plan: UnitPlan) -> tuple[list[str], str]:
    """Settings that make the socket's folder writable in the sandbox: (RuntimeDirectory=
    lines, an extra ReadWritePaths= item or "")."""
    sock, sock_dir = plan.socket, plan.socket.parent
    runtime_root = RUNTIME_ROOT / str(os.getuid()) if plan.user else Path("/run")
    if sock.is_relative_to(plan.root):
        return [], ""  # inside the store: writable through ReadWritePaths
    if sock_dir.is_relative_to(runtime_root) and sock_dir != runtime_root:
        # Created before the sandbox is set up, writable inside it, and kept across restarts
        # (a socket unit may own the socket inside it).
        rel = str(sock_dir.relative_to(runtime_root))
        return [
            f"RuntimeDirectory={_path_list_item(rel)}",
            "RuntimeDirectoryMode=0700" if plan.user else "RuntimeDirectoryMode=0750",
            "RuntimeDirectoryPreserve=yes",
        ], ""
    return [], " -" + _path_list_item(str(sock_dir))


def _state_directory(root: Path) -> list[str]:
    """A system store under /var/lib: systemd creates it, owned by the service's user."""
    if root.is_relative_to("/var/lib") and root != Path("/var/lib"):
        rel = _path_list_item(str(root.relative_to("/var/lib")))
        return [f"StateDirectory={rel}", "StateDirectoryMode=0700"]
    return []


def render_unit(
    store: str | os.PathLike[str],
    user: bool = True,
    socket_activation: bool = False,
    exe: str | Sequence[str] | None = None,
    *,
    name: str | None = None,
    socket_path: str | os.PathLike[str] | None = None,
    service_user: str = "clagd",
    deny_write_execute: bool = False,
    watchdog_sec: int = WATCHDOG_SEC,
) -> dict[str, str]:
    """Unit files (file name -> text) that run one daemon for `store`.

    System units run as `service_user` (group `service_user` may connect to the socket).
    `exe` is the command that starts clagd (a path, or a list such as
    `[python, "-m", "clagd"]`); default `default_exe()`. Where the socket goes: `plan_unit`.
    """
    plan = plan_unit(store, user, exe, name, socket_path)
    return _render(plan, socket_activation, service_user, deny_write_execute, watchdog_sec)


def _render(
    plan: UnitPlan,
    socket_activation: bool,
    service_user: str,
    deny_write_execute: bool,
    watchdog_sec: int,
) -> dict[str, str]:
    root, name, argv, sock = plan.root, plan.name, plan.argv, str(plan.socket)
    # systemd does not expand $ in the program path, only in the arguments
    exec_start = " ".join([_quote(argv[0], dollar=False), *(_quote(a) for a in argv[1:])])
    exec_start += " run " + _quote(str(root))
    extra, more_rw = _socket_dir_settings(plan)
    if not plan.user:
        extra = [f"User={service_user}", f"Group={service_user}", *extra]
        extra += _state_directory(root)
    in_home = root.is_relative_to("/home") or root.is_relative_to("/root")
    where = "user" if plan.user else "system"
    units = {
        f"{name}.service": _service(
            description=f"clagd memory daemon for {_escape(str(root))} ({where})",
            exec_start=exec_start,
            store=_path_list_item(str(root)) + more_rw,
            socket_env=_quote("CLAGD_SOCKET=" + sock, dollar=False),
            user=plan.user,
            socket_unit=f"{name}.socket" if socket_activation else None,
            extra_service=extra,
            protect_home="read-only" if (plan.user or in_home) else "yes",
            deny_write_execute=deny_write_execute,
            watchdog_sec=watchdog_sec,
        )
    }
    if socket_activation:
        units[f"{name}.socket"] = _socket(
            description=f"clagd socket for {_escape(str(root))}",
            listen=_escape(sock),  # the rest of the line is the path: no quoting
            user=plan.user,
            socket_user=None if plan.user else service_user,
        )
    return units


# --------------------------------------------------------------------------- sandbox check

# Folders a setting hides from the service, and the value that would show them again.
_HIDDEN_BY = (
    ("PrivateTmp", ("yes", "true", "on", "1"), ("/tmp", "/var/tmp"), "PrivateTmp=no"),
    (
        "ProtectHome",
        ("yes", "true", "on", "1", "tmpfs"),
        ("/home", "/root", "/run/user"),
        "ProtectHome=read-only",
    ),
)


def _setting(unit_text: str, key: str) -> str:
    values = [
        line.partition("=")[2].strip()
        for line in unit_text.splitlines()
        if line.startswith(f"{key}=")
    ]
    return values[-1] if values else ""


def sandbox_problems(plan: UnitPlan, service_text: str) -> list[str]:
    """Paths the service needs (its executable, the store, the socket's folder) that its own
    sandboxing hides: such a unit cannot start, or serves a socket no client sees. One line
    per problem, naming the setting to change."""
    needed = [("the clagd executable", Path(plan.argv[0]))]
    needed += [("the store", plan.root), ("the socket", plan.socket)]
    problems = []
    for key, on, hidden, fix in _HIDDEN_BY:
        if _setting(service_text, key).lower() not in on:
            continue
        for what, path in needed:
            for p in dict.fromkeys([path, path.resolve()]):
                top = next((h for h in hidden if p.is_relative_to(h)), None)
                if top is not None:
                    problems.append(
                        f"{what} {p} is under {top}, which {key}="
                        f"{_setting(service_text, key)} hides from the service: move it, "
                        f"or change {key}= in the unit ({fix})"
                    )
                    break
    return problems


def render_static_units(
    exe_user: str = "%h/.local/bin/clagd", exe_system: str = "/usr/local/bin/clagd"
) -> dict[str, str]:
    """The generic units of `systemd/` (relative path -> text), written with specifiers."""
    user_store = "%h/.local/share/clagd/memory"
    tmpl_store = "%h/.local/share/clagd/%i"
    sys_store = "/var/lib/clagd/%i"
    out: dict[str, str] = {}
    user_runtime = [
        "RuntimeDirectory=clagd",
        "RuntimeDirectoryMode=0700",
        "RuntimeDirectoryPreserve=yes",
    ]
    for fname, store, sock, desc in (
        ("clagd.service", user_store, "%t/clagd/clagd.sock", "clagd memory daemon"),
        ("clagd@.service", tmpl_store, "%t/clagd/%i.sock", "clagd memory daemon for store %i"),
    ):
        out[f"user/{fname}"] = _service(
            description=desc,
            exec_start=f"{exe_user} run {store}",
            store=store,
            socket_env=f"CLAGD_SOCKET={sock}",
            user=True,
            socket_unit=None,
            extra_service=[
                # create the store's directory outside the sandbox (ReadWritePaths needs it)
                f"ExecStartPre=+/bin/mkdir -p {store}",
                *user_runtime,
            ],
        )
        out[f"user/{fname.replace('.service', '.socket')}"] = _socket(
            description=desc.replace("daemon", "daemon socket"), listen=sock, user=True
        )
    # a follower (clagd follow): the primary's remote comes from an environment file
    out["user/clagd-follow@.service"] = _service(
        description="clagd follower (read-only) for store %i",
        exec_start=f"{exe_user} follow ${{CLAGD_FOLLOW_REMOTE}} {tmpl_store}",
        store=tmpl_store,
        socket_env="CLAGD_SOCKET=%t/clagd/%i.sock",
        user=True,
        socket_unit=None,
        extra_service=[
            # one line: CLAGD_FOLLOW_REMOTE=git://primary.example/memory.git (docs/service.md)
            "EnvironmentFile=%h/.config/clagd/follow-%i.env",
            f"ExecStartPre=+/bin/mkdir -p {tmpl_store}",
            *user_runtime,
        ],
    )
    out["system/clagd@.service"] = _service(
        description="clagd memory daemon for store %i (system)",
        exec_start=f"{exe_system} run {sys_store}",
        store=sys_store,
        socket_env="CLAGD_SOCKET=/run/clagd/%i.sock",
        user=False,
        socket_unit=None,
        extra_service=[
            "User=clagd",
            "Group=clagd",
            "StateDirectory=clagd/%i",
            "StateDirectoryMode=0700",
            "RuntimeDirectory=clagd",
            "RuntimeDirectoryMode=0750",
            "RuntimeDirectoryPreserve=yes",
        ],
        protect_home="yes",
    )
    out["system/clagd@.socket"] = _socket(
        description="clagd memory daemon socket for store %i (system)",
        listen="/run/clagd/%i.sock",
        user=False,
        socket_user="clagd",
    )
    out["system/clagd.sysusers.conf"] = (
        "# systemd-sysusers(8): the account the system units run as.\n"
        "# Install to /etc/sysusers.d/clagd.conf, then: systemd-sysusers\n"
        'u clagd - "clagd memory daemon" /var/lib/clagd /usr/sbin/nologin\n'
    )
    return out


# --------------------------------------------------------------------------- installing


def _user_unit_dir() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "systemd" / "user"


def install_service(
    store: str | os.PathLike[str],
    user: bool = True,
    dest: str | os.PathLike[str] | None = None,
    *,
    socket_activation: bool = False,
    exe: str | Sequence[str] | None = None,
    name: str | None = None,
    force: bool = False,
    warn: Callable[[str], object] | None = None,
) -> tuple[list[Path], str]:
    """Write the units for `store`; return (files written, the command to run next).

    Refuses (`ClagdError`, code `sandbox`) when the unit's own sandboxing would hide the
    executable, the store or the socket from the service (a unit that cannot start); with
    `force` it writes them anyway and passes each problem to `warn`. The store directory is
    created when missing (an empty directory: `clagd run` fills it) because the sandbox needs
    `ReadWritePaths=` to exist.
    """
    plan = plan_unit(store, user, exe, name)
    root = plan.root
    units = _render(plan, socket_activation, "clagd", False, WATCHDOG_SEC)
    problems = sandbox_problems(plan, units[f"{plan.name}.service"])
    if problems and not force:
        raise ClagdError(
            "the unit could not start: " + "; ".join(problems) + " (--force writes it anyway)",
            "sandbox",
        )
    for problem in problems:
        if warn is not None:
            warn(f"warning: {problem}")
    target = (
        Path(dest)
        if dest is not None
        else (_user_unit_dir() if user else Path("/etc/systemd/system"))
    )
    try:
        target.mkdir(parents=True, exist_ok=True)
        if user:
            root.mkdir(parents=True, exist_ok=True)
        written = []
        for fname, text in units.items():
            path = target / fname
            tmp = path.with_name(f".{fname}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
            written.append(path)
    except OSError as exc:
        raise ClagdError(
            f"cannot write units to {target}: {exc.strerror or exc}", "install"
        ) from None
    main = next(f for f in units if f.endswith(".socket" if socket_activation else ".service"))
    ctl = "systemctl --user" if user else "sudo systemctl"
    command = f"{ctl} daemon-reload && {ctl} enable --now {main}"
    return written, command


def install_service_command(
    store: str | os.PathLike[str],
    user: bool = True,
    dest: str | os.PathLike[str] | None = None,
    print_fn: Callable[[str], object] = print,
    *,
    socket_activation: bool = False,
    exe: str | Sequence[str] | None = None,
    name: str | None = None,
    force: bool = False,
) -> list[Path]:
    """What `clagd install-service` does: write the units, then print what to run next."""
    written, command = install_service(
        store,
        user=user,
        dest=dest,
        socket_activation=socket_activation,
        exe=exe,
        name=name,
        force=force,
        warn=print_fn,
    )
    for path in written:
        print_fn(f"wrote {path}")
    print_fn("next:")
    print_fn(f"  {command}")
    if user:
        print_fn('  loginctl enable-linger "$USER"   # optional: keep it running after logout')
    else:
        print_fn(
            "  (the units run as user 'clagd': create it first, see systemd/system/clagd.sysusers.conf)"
        )
    return written


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clagd.serve.units")
    parser.add_argument("--write-static", metavar="DIR", help="regenerate the generic units in DIR")
    args = parser.parse_args(argv)
    if not args.write_static:
        parser.print_help()
        return 2
    for rel, text in render_static_units().items():
        path = Path(args.write_static) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
