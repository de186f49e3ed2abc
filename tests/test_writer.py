"""The writer: a failed operation leaves nothing half-done and touches nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import git, make_store

from clagd.engine import Engine
from clagd.inbox import Item
from clagd.model import Memory
from clagd.store import load_state


class Boom(RuntimeError):
    pass


def test_failed_operation_restores_only_what_it_touched(tmp_path: Path) -> None:
    root = make_store(tmp_path / "m")
    eng = Engine(root)
    try:
        eng.ingest([Item(f"memory {i} about apples", None, {}) for i in range(4)], "test")
        eng.recluster("test")
        cids = sorted(eng.state.clusters)
        assert cids
        # a hand edit in progress in another file must survive the failure
        other = root / "unsorted" / "u-20260101T000000-aaaaaa.yaml"
        other.write_text(yaml.safe_dump({"memories": [Memory.new("hand-added note").to_dict()]}))
        head = git(root, "rev-parse", "HEAD")

        def bad_op(ctx, cid: str) -> None:
            ctx.touch_cluster(cid)
            ctx.state.clusters[cid].memories.append(Memory.new("half-applied memory"))
            ctx.state.clusters[cid].name = "Half applied"
            from clagd.store import write_cluster

            write_cluster(ctx.paths, ctx.state.clusters[cid])  # on disk, then a failure
            raise Boom("disk trouble")

        with pytest.raises(Boom):
            eng.writer.call(bad_op, cids[0])
        assert git(root, "rev-parse", "HEAD") == head
        assert "half-applied" not in (root / "clusters" / f"{cids[0]}.yaml").read_text()
        assert other.exists()  # untouched
        assert eng.state.clusters[cids[0]].name != "Half applied"
        assert all(m.content != "half-applied memory" for m, _a, _k in eng.state.all_memories())
        assert "half-applied memory" not in [
            h["content"] for h in eng.query("half applied memory", count_round=False)["memories"]
        ]
        files = load_state(root)
        files.unsorted.pop("u-20260101T000000-aaaaaa")
        assert files.memory_ids() == eng.state.memory_ids()
        assert eng.writer.failures == 1 and "disk trouble" in eng.writer.last_error
    finally:
        eng.close()


def test_start_after_a_kill_mid_write_restores_only_the_files_of_that_change(
    tmp_path: Path,
) -> None:
    root = make_store(tmp_path / "m")
    eng = Engine(root)
    eng.ingest([Item("a committed memory", None, {})], "test")
    eng.close()
    shard = next((root / "unsorted").glob("u-*.yaml"))
    committed = shard.read_text()
    # the killed change: it was rewriting `shard` and adding a new shard
    half = root / "unsorted" / "u-20260101T000000-bbbbbb.yaml"
    half.write_text(yaml.safe_dump({"memories": [Memory.new("half-written").to_dict()]}))
    shard.write_text(committed + "- {id: m-0000000000000001, content: torn}\n")
    # and a hand edit of the user's, elsewhere, at the same time
    mine = root / "unsorted" / "u-20260101T000000-cccccc.yaml"
    mine.write_text(yaml.safe_dump({"memories": [Memory.new("the user's own note").to_dict()]}))
    rel = [str(p.relative_to(root)) for p in (shard, half)]
    (root / ".clagd" / "txn").write_text("ingest: 1 memory\n" + "\n".join(rel) + "\n")
    eng = Engine(root)
    try:
        assert shard.read_text() == committed and not half.exists() and mine.exists()
        contents = sorted(m.content for m, _a, _k in eng.state.all_memories())
        assert contents == ["a committed memory", "the user's own note"]
        assert not (root / ".clagd" / "txn").exists()
    finally:
        eng.close()
