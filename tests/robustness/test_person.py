"""The person at the keyboard (benchmarks/person_harness.py, short run): ordinary git use
in the store under load, and SIGKILLs, lose no acknowledged memory and hide no rewrite."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from helpers import REALISTIC

ROOT = Path(__file__).resolve().parents[2]


def _harness():
    spec = importlib.util.spec_from_file_location(
        "person_harness", ROOT / "benchmarks" / "person_harness.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["person_harness"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_a_person_at_the_keyboard_loses_nothing_acknowledged(short_tmp: Path) -> None:
    # from a realistic store (issue 26): its memories must stay in HEAD once each too
    report = _harness().run(
        rounds=1, kills=2, seed=5, workdir=short_tmp / "p", verbose=False, realistic=REALISTIC
    )
    print({k: v for k, v in report.items() if k != "problems"})
    assert sum(report["person_steps"].values()) == 14 and report["kills"] == 2
    assert report["acked_after_last_rewrite"] > 0 and report["lost"] == 0
    assert report["acked_gone_unreported"] == 0
    assert report["realistic_memories"] == REALISTIC  # each in HEAD once, or a problem below
    # the daemon serves HEAD after quiescence (a fresh load and a restart serve the same)
    assert report["problems"] == []
