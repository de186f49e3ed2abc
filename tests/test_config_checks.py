"""Configuration: every value checked for range and choice at start (exit 78, naming the
key and the file), duplicate keys refused, the socket setting never chmods a directory
that is not clagd's, and a clagd.yaml changed while running is applied or reported."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import InProcessDaemon, make_store, wait_for

from clagd.config import load_config
from clagd.errors import ConfigError

BAD = [
    ("server", "max_clients", 0),
    ("server", "max_request_bytes", 0),
    ("server", "read_timeout", -1),
    ("inbox", "rescan_seconds", 0),
    ("retrieval", "k1", float("nan")),
    ("retrieval", "idf", "okapy"),
    ("retrieval", "b", 1.5),
    ("retrieval", "min_relative_score", 1.5),
    ("retrieval", "min_term_rarity", -0.1),
    ("retrieval", "neighbors", "episode"),
    ("retrieval", "neighbor_gap_minutes", -5),
    ("retrieval", "second_neighbor_weight", -0.1),
    ("session", "validate_fraction", 2),
    ("archive", "cold_after_days", -1),
    ("git", "branch", "-bad..name"),
]


@pytest.mark.parametrize("section,key,value", BAD)
def test_values_out_of_range_are_refused_naming_key_and_file(
    tmp_path: Path, section: str, key: str, value: object
) -> None:
    store = make_store(tmp_path / "memory", {section: {key: value}})
    with pytest.raises(ConfigError) as err:
        load_config(store)
    assert f"'{section}.{key}'" in str(err.value)
    assert str(store / "clagd.yaml") in str(err.value)


def test_run_exits_78_on_a_bad_value(tmp_path: Path) -> None:
    store = make_store(tmp_path / "memory", {"server": {"max_clients": 0}})
    r = subprocess.run(
        [sys.executable, "-m", "clagd", "--store", str(store), "run"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 78
    assert "server.max_clients" in r.stderr and "clagd.yaml" in r.stderr
    assert "Traceback" not in r.stderr


def test_log_level_is_a_choice(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "clagd",
            "--store",
            str(tmp_path / "m"),
            "run",
            "--log-level",
            "LOUD",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "LOUD" in r.stderr and not (tmp_path / "m").exists()


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    store = make_store(tmp_path / "memory")
    text = (store / "clagd.yaml").read_text()
    (store / "clagd.yaml").write_text(text + "\ninbox:\n  max_batch: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(store)
    assert "inbox" in str(err.value) and "twice" in str(err.value)


def test_a_relative_socket_outside_the_store_chmods_nothing(tmp_path: Path) -> None:
    parent = tmp_path / "p"
    store = make_store(parent / "memory", {"server": {"socket": "../x.sock"}})
    os.chmod(parent, 0o755)
    d = InProcessDaemon(store)
    try:
        with d.client() as c:
            assert c.add("reachable on ../x.sock")["added"] == 1
        assert stat.S_IMODE(parent.stat().st_mode) == 0o755
        assert d.socket.resolve() == parent / "x.sock"
    finally:
        d.stop()


def test_a_changed_config_is_applied_or_reported(daemon: InProcessDaemon) -> None:
    path = daemon.root / "clagd.yaml"
    data = yaml.safe_load(path.read_text())
    data["session"]["memory_add_threshold"] = 7
    data.setdefault("server", {})["max_clients"] = 9
    path.write_text(yaml.safe_dump(data))
    with daemon.client() as c:
        st = wait_for(lambda: (s := c.status())["config"]["applied"] and s, 15, "the reload")
        assert st["config"]["applied"] == ["session.memory_add_threshold"]
        assert st["config"]["restart_needed"] == ["server.max_clients"]
        assert daemon.engine.config.session.memory_add_threshold == 7
        data["retrieval"] = {"k1": -1}
        path.write_text(yaml.safe_dump(data))
        st = wait_for(lambda: (s := c.status())["config"]["error"] and s, 15, "the error")
        assert "'retrieval.k1'" in st["config"]["error"]
        assert daemon.engine.config.retrieval.k1 == 1.2  # still running with the old value


def test_a_yaml_syntax_error_names_the_file_and_the_line(tmp_path: Path) -> None:
    store = make_store(tmp_path / "memory")
    path = store / "clagd.yaml"
    path.write_text("retrieval:\n  max_memories: 5\n   k1: 1.2\n")
    with pytest.raises(ConfigError) as err:
        load_config(store, env={})
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and "line 3" in msg, msg
    assert "<unicode string>" not in msg
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAGD_")}
    run = subprocess.run(
        [sys.executable, "-m", "clagd", "run", str(store)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert run.returncode == 78
    assert str(path) in run.stderr and "<unicode string>" not in run.stderr
