"""SIGHUP reloads clagd.yaml, as the config watcher does, instead of killing the daemon."""

from __future__ import annotations

import os
import signal

from helpers import DaemonProcess, wait_for


def test_sighup_reloads_the_config_and_the_daemon_keeps_serving(
    daemon_proc: DaemonProcess,
) -> None:
    p = daemon_proc.start()
    path = p.root / "clagd.yaml"
    text = path.read_text()
    assert "memory_add_threshold: 100000" in text
    st = path.stat()
    # same size, same mtime: the watcher (mtime and size) cannot see it, only SIGHUP can
    path.write_text(text.replace("memory_add_threshold: 100000", "memory_add_threshold: 900000"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.proc is not None
    p.proc.send_signal(signal.SIGHUP)
    with p.client() as c:
        s = wait_for(lambda: (s := c.status())["config"]["applied"] and s, 15, "the reload")
        assert s["config"]["applied"] == ["session.memory_add_threshold"]
        assert c.add("still serving after SIGHUP")["added"] == 1
    assert p.proc.poll() is None
    assert "SIGHUP: reloading" in p.log.read_text()
    assert p.terminate() == 0
