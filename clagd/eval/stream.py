"""Protocol `stream`: a real daemon (`clagd run` in a child process, its own socket and
inbox) takes a conversation's turns as an agent would write them, and organizes them with
its own triggers (new-memory count, dialogue rounds, interval, route pass) and the store's
default config. The questions are asked through the socket once everything is ingested and
the daemon is idle.

Each arrival (one LoCoMo session, or `batch` turns) is written Maildir-style: into
`inbox/.tmp/`, then renamed into `inbox/`, so the daemon never sees half a file. Between
arrivals the harness waits until the daemon is idle (the file taken in, the writer's queue
empty, no route pass waiting, no session queued or running), because days pass between two
LoCoMo sessions; every wait is a poll with a deadline.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import clagd
from clagd.client import Client, ClientError
from clagd.config import BackendKind, Config
from clagd.errors import ClagdError
from clagd.eval.data import Turn, arrivals
from clagd.eval.pipelines import Organization, organization_of
from clagd.scopes import DEFAULT_SCOPE
from clagd.store.create import init_store
from clagd.yamlio import dumps

POLL_SECONDS = 0.02


class DaemonError(ClagdError):
    """The eval's daemon did not start, lost a file, or did not become idle in time."""


def is_idle(status: dict[str, Any], dropped: int) -> bool:
    """Everything dropped so far is ingested and organized as far as the daemon's own
    triggers go: the inbox took every file, nothing waits on the writer, no route pass is
    pending, no session is queued or running."""
    inbox = status.get("inbox", {})
    activity = status.get("activity", {})
    return (
        inbox.get("files_ingested", 0) + inbox.get("files_rejected", 0) >= dropped
        and status["writer"]["pending"] == 0
        and status["route_pending"] == 0
        and not activity.get("session_queued", False)
        and not activity.get("session_running", False)
    )


class DaemonPipeline:
    """A daemon over a fresh store in a temporary directory, for one conversation."""

    def __init__(
        self,
        config: Config,
        backend: BackendKind = "none",
        batch: int | None = None,
        deadline: float = 300.0,
        log: Any = None,
        scope: str = DEFAULT_SCOPE,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="clagd-eval-")
        self.scope = scope  # every turn and question of the run in this scope
        base = Path(self._tmp.name)
        self.config = copy.deepcopy(config)
        self.config.backend.kind = backend
        self.batch = batch
        self.deadline = deadline
        self.log = log
        self.store, _ = init_store(base / "store")
        (self.store / "clagd.yaml").write_text(dumps(self.config.to_dict()), encoding="utf-8")
        self.inbox = self.store / "inbox"
        (self.inbox / ".tmp").mkdir(parents=True, exist_ok=True)
        self.socket = base / "s.sock"
        self.dropped = 0
        self._log_path = base / "daemon.log"
        self.proc = self._spawn()
        self.client = Client(self.socket, timeout=self.deadline)
        try:
            self._wait_ready()
        except BaseException:  # a failed start, or the eval stopped meanwhile (SIGTERM)
            self.close()
            raise

    # -- the daemon -------------------------------------------------------------------
    def _spawn(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        # the child imports the same clagd as this process (a worktree, not an install)
        src = str(Path(clagd.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        with open(self._log_path, "wb") as logf:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "clagd",
                    "--store",
                    str(self.store),
                    "--socket",
                    str(self.socket),
                    "run",
                    "--log-level",
                    "WARNING",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=logf,
                env=env,
            )

    def _log_tail(self) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def _poll(self, what: str, cond: Any, busy: Any = None) -> Any:
        """Until `cond()` answers; the deadline counts from the last time `busy()` (checked
        after each `cond()`) said the daemon was at work."""
        end = time.monotonic() + self.deadline
        while True:
            if self.proc.poll() is not None:
                raise DaemonError(
                    f"the eval daemon exited ({self.proc.returncode}) while waiting for "
                    f"{what}:\n{self._log_tail()}"
                )
            value = cond()
            if value:
                return value
            if busy is not None and busy():
                end = time.monotonic() + self.deadline
            if time.monotonic() > end:
                raise DaemonError(f"timed out after {self.deadline:.0f}s waiting for {what}")
            time.sleep(POLL_SECONDS)

    def _wait_ready(self) -> None:
        def ping() -> bool:
            try:
                self.client.ping()
            except (ClientError, OSError):
                self.client.close()
                return False
            return True

        self._poll("the daemon to answer ping", ping)

    def wait_idle(self) -> dict[str, Any]:
        """Poll `status` until the daemon is idle; returns that status. A session running
        is work in progress (a model's may take longer than the deadline, which then counts
        from its end): the wait gives up only on a daemon idle in nothing but name."""
        running = [False]

        def idle() -> dict[str, Any] | None:
            st = self.client.status().raw
            running[0] = bool(st.get("activity", {}).get("session_running"))
            return st if is_idle(st, self.dropped) else None

        st: dict[str, Any] = self._poll("the daemon to become idle", idle, busy=lambda: running[0])
        rejected = st.get("inbox", {}).get("files_rejected", 0)
        if rejected:
            raise DaemonError(f"the daemon rejected {rejected} inbox file(s):\n{self._log_tail()}")
        return st

    # -- the protocol -----------------------------------------------------------------
    def drop(self, turns: list[Turn]) -> None:
        """Write one arrival Maildir-style: complete in inbox/.tmp, then renamed in."""
        self.dropped += 1
        name = f"{self.dropped:05d}.json"
        items = [{"content": t.content, "created_at": t.created_at} for t in turns]
        if self.scope != DEFAULT_SCOPE:
            items = [{**it, "scope": self.scope} for it in items]
        tmp = self.inbox / ".tmp" / name
        tmp.write_text(json.dumps(items), encoding="utf-8")
        os.rename(tmp, self.inbox / name)

    def ingest(self, turns: list[Turn]) -> None:
        groups = list(arrivals(turns, self.batch))
        for i, group in enumerate(groups, 1):
            self.drop(group)
            st = self.wait_idle()
            if self.log is not None:
                org = organization_of(st)
                self.log(
                    f"arrival {i}/{len(groups)}: {org['memories']} memories, "
                    f"{org['sessions']} sessions, {org['clusters']} clusters, "
                    f"{org['routed']} routed, {org['unsorted']} unsorted"
                )

    def query(self, text: str, k: int) -> dict[str, Any]:
        return self.client.query(text, max_memories=k, token_budget=0, scope=self.scope).to_dict()

    def settle(self) -> None:
        """A query is a dialogue round; when the rounds trigger a session, the next question
        waits until it is done (an answer then never depends on a race). Not timed."""
        if not is_idle(self.client.status().raw, self.dropped):
            self.wait_idle()

    def organization(self) -> Organization:
        return organization_of(self.client.status().raw)

    def close(self) -> None:
        try:
            self.client.close()
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            self._tmp.cleanup()
