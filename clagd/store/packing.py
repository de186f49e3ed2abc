"""Packing the store's objects: `git gc --auto`, run by the daemon in the background.

clagd commits with plumbing (`commit-tree`, `update-ref`), which never runs the `gc --auto`
that a person's `git commit` runs, and it writes its loose objects uncompressed
(`core.looseCompression=0` for its own `git add`: a route pass rewrites ~500 cluster files,
and compressing them was half of git's time). Left alone, every route pass would leave ~500
loose objects (~10 MB at 100k memories) for good. So the housekeeping job starts `git gc
--auto` every `git.gc_interval_minutes`:

* git's own thresholds decide whether there is work (`gc.auto`, ~6,700 loose objects by
  default, and `gc.autoPackLimit`); below them the command returns at once. A person's
  `gc.auto = 0` in the store's config turns packing off, as it does for their own git.
* Or their size: the daemon's trees are loose and uncompressed too, and `clusters/`'s tree
  is ~0.5 MB at 11k clusters, written by every commit, so ~6,700 loose objects can be
  gigabytes. When git's own estimate (the objects in `objects/17/`, times 256) by bytes
  passes `LOOSE_BYTES_LIMIT`, the run packs whatever the count says (`gc.auto=1`).
* It runs beside the daemon, never on the writer: git's gc is made to run while other git
  commands write (new loose objects are not in the pack it makes and are not pruned; a
  `gc` of the person's holds `gc.pid` and ours then returns at once).
* At nice 19 and with one delta thread (`pack.threads=1`): on a busy machine it gets
  the CPU the queries and the writer leave.
* `gc.autoDetach=false`: the daemon waits for its own child, reports it in `status`
  (`git_gc`) and does not leave it behind when it stops.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from clagd.store.gitcmd import common_dir, git_dir, git_env

log = logging.getLogger("clagd.git")

GC_COMMAND = (
    "git",
    "-c",
    "gc.autoDetach=false",
    "-c",
    "pack.threads=1",
    "gc",
    "--auto",
    "--quiet",
)
GC_NICE = 19
LOOSE_BYTES_LIMIT = 256 << 20  # estimated loose bytes from which a run packs whatever the count


def loose_bytes(root: Path) -> int:
    """The loose objects' bytes as git estimates their count: one fan-out folder's, times
    256 (object ids are uniform)."""
    try:
        folder = common_dir(git_dir(root)) / "objects" / "17"
        with os.scandir(folder) as entries:
            return 256 * sum(e.stat().st_size for e in entries if e.is_file())
    except OSError:
        return 0


def gc_command(root: Path) -> tuple[str, ...]:
    """`GC_COMMAND`, told to pack whatever git's count says when the loose objects are over
    `LOOSE_BYTES_LIMIT` by size, unless the person's `gc.auto = 0` turns packing off."""
    if loose_bytes(root) <= LOOSE_BYTES_LIMIT:
        return GC_COMMAND
    auto = subprocess.run(
        ("git", "config", "--get", "gc.auto"),
        cwd=root,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=git_env(),
    ).stdout.strip()
    if auto == "0":
        return GC_COMMAND
    return (*GC_COMMAND[:1], "-c", "gc.auto=1", *GC_COMMAND[1:])


def _packs(root: Path) -> set[str]:
    try:
        pack = common_dir(git_dir(root)) / "objects" / "pack"
        return {p for p in os.listdir(pack) if p.endswith(".pack")}
    except OSError:
        return set()


@dataclass(frozen=True)
class GcStatus:
    """The `git_gc` section of `status`."""

    enabled: bool
    running: bool
    runs: int
    packed: int
    failures: int
    last_run: str | None
    last_result: str


class ObjectPacker:
    """Starts `git gc --auto` when it is due and none runs, and reports how the last one
    went. `maybe_start` and `poll` are called from housekeeping; nothing here blocks."""

    def __init__(self, root: Path, interval_seconds: float) -> None:
        self.root = Path(root)
        self.interval = interval_seconds
        self._lock = threading.Lock()  # housekeeping starts and polls; status polls
        self._proc: subprocess.Popen[bytes] | None = None
        self._err: IO[bytes] | None = None
        self._packs_before: set[str] = set()
        self._started = 0.0  # monotonic, of the running or the last run
        self._next = time.monotonic() + min(interval_seconds, 60.0)  # not during start-up
        self.runs = 0
        self.packed = 0  # runs that made a pack
        self.failures = 0
        self.last_run: str | None = None  # ISO time of the last finished run
        self.last_result = ""  # "", "nothing to pack", "packed ...", "failed: ..."

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    def due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.enabled and self._proc is None and now >= self._next

    def maybe_start(self, now: float | None = None) -> bool:
        """Start a run when one is due (see `due`). Returns whether one was started."""
        with self._lock:
            self._poll()
            if not self.due(now):
                return False
            return self._start()

    def start(self) -> bool:
        """Start a run now, unless one runs."""
        with self._lock:
            return self._start()

    def _start(self) -> bool:
        if self._proc is not None:
            return False
        self._next = time.monotonic() + self.interval
        self._packs_before = _packs(self.root)
        err = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(
                gc_command(self.root),
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=git_env(),
            )
        except OSError as exc:
            err.close()
            self._finished(False, f"failed: could not start git gc: {exc}")
            return False
        try:
            os.setpriority(os.PRIO_PROCESS, proc.pid, GC_NICE)
        except OSError:
            pass  # it has already ended, or the system refuses: it runs at our priority
        self._proc, self._err, self._started = proc, err, time.monotonic()
        return True

    def poll(self) -> bool:
        """Take in a finished run. Returns whether one is still running."""
        with self._lock:
            return self._poll()

    def _poll(self) -> bool:
        proc = self._proc
        if proc is None:
            return False
        code = proc.poll()
        if code is None:
            return True
        self._collect(code)
        return False

    def _collect(self, code: int, stopped: bool = False) -> None:
        assert self._proc is not None and self._err is not None
        err = self._err
        err.seek(0)
        text = err.read().decode("utf-8", "replace").strip()
        err.close()
        self._proc, self._err = None, None
        took = time.monotonic() - self._started
        if stopped and code != 0:
            self._finished(True, f"stopped with the daemon after {took:.1f} s")
            return
        if code != 0:
            last = text.splitlines()[-1] if text else f"exit status {code}"
            self._finished(False, f"failed: git gc --auto: {last}")
            return
        new = _packs(self.root) - self._packs_before
        if new:
            self.packed += 1
            self._finished(True, f"packed the loose objects in {took:.1f} s")
        else:
            self._finished(True, "nothing to pack")

    def _finished(self, ok: bool, result: str) -> None:
        self.runs += 1
        self.last_run = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.last_result = result
        if not ok:
            self.failures += 1
            log.warning("%s (tried again in %.0f minutes)", result, self.interval / 60)
        elif result != "nothing to pack":
            log.info("git gc --auto: %s", result)

    def resume(self) -> None:
        """Runs are due again (after a `stop` that only paused them: a history rewrite)."""
        with self._lock:
            self._next = time.monotonic() + min(self.interval, 60.0)

    def stop(self, timeout: float = 2.0) -> None:
        """Let a running gc finish for up to `timeout` seconds, else stop it (git leaves only
        a temporary pack behind, which the next gc removes)."""
        with self._lock:
            self._next = float("inf")  # no new run once the daemon stops
            proc = self._proc
            if proc is None:
                return
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    code = proc.wait(5.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    code = proc.wait()
            self._collect(code, stopped=True)

    def status(self) -> GcStatus:
        return GcStatus(
            self.enabled,
            self.poll(),
            self.runs,
            self.packed,
            self.failures,
            self.last_run,
            self.last_result,
        )
