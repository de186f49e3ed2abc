"""Optional replication: `git push` to a configured remote after commits, in the background.
A failed push is retried and reported; it never blocks the writer."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from clagd.store.gitrepo import GitStore

log = logging.getLogger("clagd.replicate")


@dataclass(frozen=True)
class ReplicationStatus:
    """The `replication` section of `status`: the remote, the last commit pushed."""

    remote: str
    pushed: str | None
    pushes: int
    failures: int
    last_error: str


class Replicator:
    def __init__(self, git: GitStore, remote: str, branch: str, retry_seconds: float) -> None:
        self.git = git
        self.remote = remote
        self.branch = branch
        self.retry_seconds = retry_seconds
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clagd-push", daemon=True)
        self.pushed: str | None = None
        self.pushes = 0
        self.failures = 0
        self.last_error = ""

    def start(self) -> None:
        self._thread.start()
        self._wake.set()

    def notify(self, _commit: str | None = None) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            woke = self._wake.wait(self.retry_seconds)
            self._wake.clear()
            if self._stop.is_set():
                break
            head = self.git.head()
            if head is None or (head == self.pushed and woke is False):
                continue
            if head == self.pushed:
                continue
            try:
                self.git.push(self.remote, self.branch)
            except Exception as exc:  # noqa: BLE001
                self.failures += 1
                self.last_error = " ".join(str(getattr(exc, "stderr", exc)).split())[:500]
                log.error(
                    "push to %s failed (retrying in %ss): %s",
                    self.remote,
                    self.retry_seconds,
                    self.last_error,
                )
                continue
            self.pushed = head
            self.pushes += 1
            self.last_error = ""
            log.info("pushed %s to %s", head[:10], self.remote)

    def status(self) -> ReplicationStatus:
        return ReplicationStatus(
            self.remote, self.pushed, self.pushes, self.failures, self.last_error
        )
