"""`clagd install-service` refuses to write a unit whose own sandboxing hides what the service
needs (its executable, the store, the socket): such a unit cannot start. The error names the
setting to change; `--force` writes the unit anyway and prints each problem as a warning."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from clagd.cli import main
from clagd.errors import ClagdError
from clagd.serve.units import install_service, plan_unit, render_unit, sandbox_problems


def problems(store: str | Path, exe: str, user: bool) -> list[str]:
    plan = plan_unit(store, user, exe)
    return sandbox_problems(plan, render_unit(store, user=user, exe=exe)[f"{plan.name}.service"])


def test_binary_under_tmp_with_private_tmp_is_refused(tmp_path: Path) -> None:
    dest = tmp_path / "units"
    exe = str(tmp_path / "venv" / "bin" / "clagd")  # tmp_path lives under /tmp
    if not Path(exe).is_relative_to("/tmp"):
        pytest.skip("pytest's tmp_path is not under /tmp here")
    with pytest.raises(ClagdError) as err:
        install_service("/var/lib/clagd/agent", user=False, dest=dest, exe=exe)
    msg = str(err.value)
    assert err.value.code == "sandbox"
    assert f"the clagd executable {exe} is under /tmp" in msg
    assert "PrivateTmp=no" in msg and "--force" in msg
    assert not dest.exists() or not any(dest.iterdir())  # nothing written

    warnings: list[str] = []
    written, _ = install_service(
        "/var/lib/clagd/agent", user=False, dest=dest, exe=exe, force=True, warn=warnings.append
    )
    assert [p.name for p in written] == ["clagd-agent.service"]
    assert len(warnings) == 1 and warnings[0].startswith("warning: the clagd executable")
    assert "PrivateTmp=yes" in written[0].read_text()


def test_binary_in_a_home_with_protect_home_yes_is_refused() -> None:
    # a system unit for a store outside /home gets ProtectHome=yes: /home is invisible
    found = problems("/var/lib/clagd/agent", "/home/ann/.venv/bin/clagd", user=False)
    assert len(found) == 1
    assert "the clagd executable /home/ann/.venv/bin/clagd is under /home" in found[0]
    assert "ProtectHome=yes" in found[0] and "ProtectHome=read-only" in found[0]
    # /root too
    assert "under /root" in problems("/var/lib/clagd/a", "/root/bin/clagd", user=False)[0]


def test_store_under_tmp_is_refused_for_user_units(tmp_path: Path) -> None:
    found = problems("/tmp/memory", "/usr/bin/clagd", user=True)
    assert found and all("PrivateTmp" in p for p in found)
    assert any(p.startswith("the store /tmp/memory is under /tmp") for p in found)


def test_reachable_paths_pass() -> None:
    # user units keep the home readable (ProtectHome=read-only) and the store writable
    assert problems("/home/ann/memory", "/home/ann/.local/bin/clagd", user=True) == []
    assert problems("/var/lib/clagd/agent", "/usr/local/bin/clagd", user=False) == []
    # a system unit for a store in a home gets ProtectHome=read-only: fine as well
    assert problems("/home/ann/memory", "/usr/bin/clagd", user=False) == []


def test_cli_refuses_then_force_writes(tmp_path: Path) -> None:
    if not tmp_path.is_relative_to("/tmp"):
        pytest.skip("pytest's tmp_path is not under /tmp here")
    store, dest = tmp_path / "mem", tmp_path / "units"
    runner = CliRunner()
    args = ["--store", str(store), "install-service", "--user", "--dest", str(dest)]
    res = runner.invoke(main, args)
    assert res.exit_code == 1, res.output
    assert "is under /tmp, which PrivateTmp=yes hides from the service" in res.output
    assert not (dest / "clagd-mem.service").exists()
    res = runner.invoke(main, [*args, "--force"])
    assert res.exit_code == 0, res.output
    assert (dest / "clagd-mem.service").is_file()
    assert "warning: the store" in res.output
    assert os.access(dest / "clagd-mem.service", os.R_OK)
