"""The README's tour is examples/tour/tour.sh run for real: this test runs the same script
against a real daemon and compares its transcript with the README, line by line, so the
README cannot drift from what clagd prints.

Only what changes from run to run is masked: commit ids, commit and rejection times, session
ids, cluster ids (random) and the scratch folder. Everything else (memory ids, which memories
a query returns and in what order, cluster names, counts, the commit subjects) must match.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, wait_for

from clagd.store.lock import lock_holder

TOUR = REPO / "examples" / "tour" / "tour.sh"
README_DIR = "/tmp/tour"  # the folder the README's transcript was made in
MARK = "<!-- tour: the output of examples/tour/tour.sh /tmp/tour (tests/test_tour.py) -->"

_MASKS = [
    (re.compile(r"\bs-\d{8}T\d{6}-[0-9a-f]{12}\b"), "s-<session>"),
    (re.compile(r"\bc-[0-9a-f]{12}\b"), "c-<cluster>"),
    # a commit id: 7-40 hex digits standing alone (memory ids m-<hex> are content hashes: kept)
    (re.compile(r"(?<![\w-])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])"), "<commit>"),
    # and one of letters only (~0.1% of short ids) where only a commit id stands: a log
    # line's start, `(<commit>)`, `reverted <commit>; head <commit>`
    (re.compile(r"(^|(?<=\()|(?<=reverted )|(?<=head ))[a-f]{7,40}(?=[ );]|$)"), "<commit>"),
]
_RUN_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|\+00:00)?")


def normalise(text: str, workdir: str) -> list[str]:
    lines = []
    for line in text.replace(workdir, README_DIR).splitlines():
        for rx, sub in _MASKS:
            line = rx.sub(sub, line)
        if line.startswith(("rejected at ", "# rejected at ", "<commit> ")):
            line = _RUN_TIME.sub("<time>", line)  # when it ran; memory times stay exact
        lines.append(line.rstrip())
    return lines


def readme_transcript() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert MARK in text, "the README lost its tour marker"
    after = text.split(MARK, 1)[1]
    block = re.match(r"\s*```[a-z]*\n(.*?)\n```", after, re.S)
    assert block, "the tour marker is not followed by a code block"
    return block.group(1)


def tour_env(tmp_path: Path, how: str) -> dict[str, str]:
    """The environment of a tour run. "CLAGD": the tests' way (CLAGD="python -m clagd");
    "PATH": the README's way, CLAGD unset and a `clagd` on PATH (a wrapper that runs this
    source tree, as the installed entry point would)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLAGD", "NOTIFY_"))}
    env["PYTHONPATH"] = str(REPO)
    if how == "CLAGD":
        env["CLAGD"] = f"{sys.executable} -m clagd"
    else:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "clagd"
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m clagd "$@"\n')
        wrapper.chmod(0o755)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="the tour needs the git CLI")


@needs_git
@pytest.mark.parametrize("how", ["PATH", "CLAGD"])
def test_readme_tour_is_what_the_script_prints(tmp_path: Path, how: str) -> None:
    work = tmp_path / "tour"
    proc = subprocess.run(
        ["bash", str(TOUR), str(work)],
        env=tour_env(tmp_path, how),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    log = work / "daemon.log"
    daemon_log = log.read_text() if log.exists() else "(no daemon log)"
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{daemon_log}"

    got = normalise(proc.stdout, str(work))
    want = normalise(readme_transcript(), README_DIR)
    assert got == want, "\n".join(
        ["README tour and examples/tour/tour.sh differ (got, then README):", *got, "---", *want]
    )
    # the things the tour is there to show, asserted once more in plain words
    assert "ingest: 3 memories from inbox" in proc.stdout  # three files, one commit
    assert proc.stdout.count("[Memory ") >= 4
    # normal work logs no warnings: the only one is the broken file the tour drops on purpose
    warnings = [ln for ln in daemon_log.splitlines() if " WARNING " in ln or " ERROR " in ln]
    assert len(warnings) == 1 and "broken.json" in warnings[0], daemon_log
    # `kill %1` stopped the daemon itself, cleanly (not only a subshell around it)
    assert daemon_log.rstrip().endswith("clagd: stopped"), daemon_log
    assert lock_holder(work / "memory") is None


@needs_git
def test_tour_stops_its_daemon_when_it_is_killed(tmp_path: Path) -> None:
    """A tour cut short (Ctrl-C, a kill, a failed command) leaves no daemon behind."""
    work = tmp_path / "tour"
    proc = subprocess.Popen(
        ["bash", str(TOUR), str(work)],
        env=tour_env(tmp_path, "PATH"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        wait_for(lambda: lock_holder(work / "memory"), 60, "the tour's daemon")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_for(lambda: lock_holder(work / "memory") is None, 30, "the daemon to stop")
    assert (work / "daemon.log").read_text().rstrip().endswith("clagd: stopped")  # SIGTERM


def test_masks_keep_what_matters() -> None:
    # a changed memory id or cluster name must still fail the comparison
    a = normalise("added m-492bb1ac6c9c36ca (8c29eee131)", "/x")
    b = normalise("added m-492bb1ac6c9c36cb (0975e705a4)", "/x")
    assert a != b
    assert normalise("added m-492bb1ac6c9c36ca (8c29eee131)", "/x") == normalise(
        "added m-492bb1ac6c9c36ca (0975e705a4)", "/x"
    )
    assert normalise('  created_at: "2026-04-10T18:00:00+00:00"', "/x") == [
        '  created_at: "2026-04-10T18:00:00+00:00"'
    ]
