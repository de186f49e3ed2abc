"""A daemon killed while its loader processes parse the store (a start from YAML of a large
store) leaves nothing that holds the store: its forked workers inherited the store lock's
file, so a restart right after the kill answered "another clagd daemon (pid N) is running
on this store" for a pid that was gone (found by `crash_harness.py --realistic 100000`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers import make_store, wait_for

from clagd.store.lock import lock_holder

# a daemon's start, cut down to what matters: it holds the store lock, then loads with a
# forked worker whose chunk takes a minute (the worker writes its pid, then parses)
DAEMON = """
import multiprocessing, os, sys, time
from pathlib import Path
from clagd.engine import loader
from clagd.store.lock import StoreLock

DAEMON = os.getpid()

def slow_part(root, rels, stem, stopwords):
    if os.getpid() != DAEMON:
        Path(sys.argv[2]).write_text(str(os.getpid()))
    time.sleep(60)
    return loader.Part()

loader.load_part = slow_part
loader._start_method = lambda: multiprocessing.get_context("fork")
StoreLock(Path(sys.argv[1])).acquire()
loader._load_parts(Path(sys.argv[1]), [["clusters/a.yaml"], ["clusters/b.yaml"]], 1, False, False)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_daemon_killed_while_loading_leaves_no_process_holding_the_store(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path / "m")
    worker_pid = tmp_path / "worker.pid"
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON, str(store), str(worker_pid)])
    try:
        wait_for(lambda: worker_pid.exists() and worker_pid.read_text(), 60, "the loader")
        worker = int(worker_pid.read_text())
        assert lock_holder(store) == daemon.pid
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(10)
        # the store is free for a restart at once, and the worker ended with the daemon
        wait_for(lambda: lock_holder(store) is None, 5, "the store lock to be free")
        wait_for(lambda: not _alive(worker), 5, "the loader process to end with the daemon")
    finally:
        daemon.kill()
        daemon.wait(10)
        if worker_pid.exists() and worker_pid.read_text():
            try:
                os.kill(int(worker_pid.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
