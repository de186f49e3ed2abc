"""Private by default: a store made under a permissive umask is still closed to other
local users (folders 0700, files and git objects not readable by others), and `status`
warns when someone opened it up."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from helpers import InProcessDaemon, wait_for

from clagd.store.create import init_store


def _open_to_others(root: Path) -> list[str]:
    bad = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o007:
                bad.append(f"{p.relative_to(root)} {oct(st.st_mode)}")
    return bad


def test_store_and_history_are_private_under_umask_022(tmp_path: Path, short_tmp: Path) -> None:
    old = os.umask(0o022)
    try:
        root, created = init_store(tmp_path / "memory")
        assert created
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        d = InProcessDaemon(root, short_tmp / "s.sock")
        try:
            with d.client() as c:
                c.add("a private memory of the user")
                (root / "inbox" / "bad.json").write_text("{not json")
                wait_for(lambda: (root / "inbox" / "rejected" / "bad.json.error").exists(), 15)
                assert c.status()["privacy"] == {"private": True, "warnings": []}
                assert _open_to_others(root) == []
                os.chmod(root, 0o755)
                warnings = c.status()["privacy"]["warnings"]
                assert warnings and "readable by other users" in warnings[0]
        finally:
            d.stop()
    finally:
        os.umask(old)
