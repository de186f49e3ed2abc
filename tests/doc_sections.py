"""Running a README or quickstart section as written: its bash and python blocks, in order,
in a shell with `clagd` on PATH (a shim for this checkout) and the test daemon's store and
socket in the environment (the `shell_env` fixture, in conftest.py). Used by the tests of
the sections that must run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def section_blocks(doc: Path, section: str) -> list[tuple[str, str]]:
    """(language, code) of the bash and python blocks of `section` (a "## " heading) in `doc`."""
    text = doc.read_text(encoding="utf-8")
    start = text.index(f"\n{section}\n")
    end = text.find("\n## ", start + 1)
    part = text[start : end if end >= 0 else len(text)]
    found = re.finditer(r"```(\w*)\n(.*?)\n```", part, re.S)
    return [(m.group(1), m.group(2)) for m in found if m.group(1) in ("bash", "python")]


def run_blocks(doc: Path, section: str, env: dict[str, str], cwd: Path) -> list[str]:
    """Run each block of `section` in `doc` as written (bash -e, or python), in order; the
    stdout of each."""
    outs = []
    for lang, code in section_blocks(doc, section):
        argv = ["bash", "-e", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{doc.name}: {lang} block failed:\n{code}\n{proc.stderr}"
        outs.append(proc.stdout)
    return outs
