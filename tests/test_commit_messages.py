"""Commit subjects stay under 72 characters (CONTRIBUTING.md), with the reasons and figures
in the body: every commit after 3c40ad5, the last one made before the habit, is checked.
Outside a git checkout that has 3c40ad5 (an sdist, a shallow clone) the check is skipped and
says why. The opt-in hook `.githooks/commit-msg` makes the same check before a commit."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import REPO

BASE = "3c40ad5"
LIMIT = 72  # a subject of LIMIT characters or more fails
HOOK = REPO / ".githooks" / "commit-msg"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
    )


def _skip_unless_checkout_with_base() -> None:
    if shutil.which("git") is None:
        pytest.skip("the git CLI is not installed")
    top = _git("rev-parse", "--show-toplevel")
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != REPO.resolve():
        pytest.skip(f"{REPO} is not a git checkout (an sdist?): no history to check")
    if _git("cat-file", "-e", f"{BASE}^{{commit}}").returncode != 0:
        pytest.skip(f"commit {BASE} is not in this checkout (a shallow clone?)")


def long_subjects(log: str) -> list[str]:
    """`git log --format=%h%x09%s` lines whose subject is LIMIT characters or more."""
    out = []
    for line in log.splitlines():
        sha, _, subject = line.partition("\t")
        if len(subject) >= LIMIT:
            out.append(f"{sha} ({len(subject)} characters): {subject}")
    return out


def test_commit_subjects_after_the_base_are_under_72_characters() -> None:
    _skip_unless_checkout_with_base()
    log = _git("log", "--format=%h%x09%s", f"{BASE}..HEAD")
    assert log.returncode == 0, log.stderr
    found = long_subjects(log.stdout)
    assert not found, (
        f"commit subjects of {LIMIT} characters or more (put the details in the body):\n"
        + "\n".join(found)
    )


def test_long_subjects_finds_exactly_the_long_ones() -> None:
    log = f"aaaaaaa\t{'x' * 71}\nbbbbbbb\t{'y' * 72}\nccccccc\tshort"
    assert long_subjects(log) == [f"bbbbbbb (72 characters): {'y' * 72}"]


@pytest.mark.parametrize(
    ("message", "accepted"),
    [
        ("docs: a short subject\n\nA body line that is as long as it needs to be." * 2, True),
        ("# a comment line first\n" + "z" * 71 + "\n", True),
        ("z" * 72 + "\n\nbody\n", False),
        (
            "a subject wrapped over\n"
            + "two lines, which git reads as one subject of 75 characters\n",
            False,
        ),
    ],
)
def test_the_commit_msg_hook(tmp_path: Path, message: str, accepted: bool) -> None:
    if shutil.which("git") is None or shutil.which("bash") is None:
        pytest.skip("the hook needs git and bash")
    msg = tmp_path / "COMMIT_EDITMSG"
    msg.write_text(message, encoding="utf-8")
    done = subprocess.run([str(HOOK), str(msg)], capture_output=True, text=True, check=False)
    assert (done.returncode == 0) is accepted, done.stderr
    if not accepted:
        assert "keep it under 72" in done.stderr
