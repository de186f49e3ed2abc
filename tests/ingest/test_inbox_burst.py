"""Issue 2's acceptance test: a burst of 1,000 valid and 50 malformed files, written every
way a real writer writes, ends with exactly the distinct valid memories in HEAD."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

from helpers import InProcessDaemon, git, head_contents, make_store, wait_for

MALFORMED = [
    ("yaml", "content: [unclosed\n"),
    ("json", "{oops"),
    ("json", '{"metadata": {"a": 1}}'),
    ("json", '{"content": 12}'),
    ("yaml", "content: ''\n"),
    ("yaml", "x: &a [1, 2]\ncontent: *a\n"),
    ("md", "---\nkey: value\nnever closed\n"),
    ("json", "[]"),
]


def _valid(i: int, fmt: str) -> tuple[str, list[str]]:
    """File text in `fmt` and the memory contents it holds."""
    if i % 10 == 0:  # a duplicate of an earlier memory
        content = (
            f"memory number {i - 5} about the {['garden', 'car', 'office', 'kids'][(i - 5) % 4]}"
        )
    else:
        content = f"memory number {i} about the {['garden', 'car', 'office', 'kids'][i % 4]}"
    if fmt == "yaml":
        return f"content: {json.dumps(content)}\nmetadata:\n  importance: 0.{i % 9 + 1}\n", [
            content
        ]
    if fmt == "json":
        if i % 7 == 0:
            other = f"list item {i} about errands"
            return json.dumps([{"content": content}, {"content": other}]), [content, other]
        return json.dumps({"content": content, "metadata": {"source": "burst"}}), [content]
    if fmt == "md":
        return f"---\nsource: notes\n---\n{content}\n", [content]
    return content, [content]


def test_burst_of_1000_valid_and_50_malformed_files(daemon: InProcessDaemon) -> None:
    inbox = daemon.root / "inbox"
    rnd = random.Random(7)
    fmts = ["yaml", "json", "md", "txt"]
    expected: set[str] = set()
    jobs = []
    for i in range(1, 1001):
        fmt = fmts[i % 4]
        text, contents = _valid(i, fmt)
        expected.update(contents)
        how = ["in_place", "rename", "rename", "slow"][i % 4] if i % 50 else "slow"
        jobs.append((f"v{i:04d}.{'yml' if fmt == 'yaml' and i % 8 == 0 else fmt}", text, how))
    for j in range(50):
        fmt, text = MALFORMED[j % len(MALFORMED)]
        if j == 49:
            fmt, text = "txt", "\udcff"  # written as invalid UTF-8 below
        jobs.append((f"bad{j:02d}.{fmt}", text, rnd.choice(["in_place", "rename"])))
    rnd.shuffle(jobs)

    def write(name: str, text: str, how: str) -> None:
        data = text.encode("utf-8", "surrogateescape")
        if how == "rename":
            tmp = inbox / ".tmp" / name
            tmp.write_bytes(data)
            os.rename(tmp, inbox / name)
        elif how == "in_place":
            (inbox / name).write_bytes(data)
        else:  # slowly, in place, over about a second, in several writes
            with open(inbox / name, "wb") as fh:
                step = max(1, len(data) // 4)
                for k in range(0, len(data), step):
                    fh.write(data[k : k + step])
                    fh.flush()
                    time.sleep(0.05)  # a slow writer is what is being simulated

    slow = [j for j in jobs if j[2] == "slow"]
    fast = [j for j in jobs if j[2] != "slow"]
    slow_threads = [
        threading.Thread(target=lambda js=slow[k::8]: [write(*j) for j in js]) for k in range(8)
    ]
    for t in slow_threads:
        t.start()
    for j in fast:
        write(*j)
    for t in slow_threads:
        t.join()

    def drained() -> bool:
        left = [p.name for p in inbox.iterdir() if p.is_file()]
        return not left and len(list((inbox / "rejected").glob("*.error"))) == 50

    wait_for(drained, 120, "the inbox to drain")
    contents = head_contents(daemon.root)
    assert len(contents) == len(set(contents)), "a memory is stored twice"
    assert set(contents) == expected
    rejected = sorted(
        p.name for p in (inbox / "rejected").iterdir() if not p.name.endswith(".error")
    )
    assert len(rejected) == 50 and all(n.startswith("bad") for n in rejected)
    for n in rejected:
        reason = (inbox / "rejected" / f"{n}.error").read_text()
        assert reason.strip() and "rejected at" in reason
    assert [p.name for p in (inbox / ".tmp").iterdir()] == []
    assert git(daemon.root, "fsck", "--no-progress", "--full").strip() == ""
    with daemon.client() as c:
        st = c.status()
    assert st["counts"]["memories"] == len(expected)
    # batching: far fewer commits than files
    n_commits = int(git(daemon.root, "rev-list", "--count", "HEAD"))
    assert n_commits < 300, n_commits


def test_a_burst_is_committed_in_batches_of_max_batch_and_a_file_whole(
    tmp_path: Path, short_tmp: Path
) -> None:
    """`inbox.max_batch`: a commit takes files until it holds that many memories (one
    commit of 2,000 held the writer ~300 ms at 100k), so a burst of small files becomes
    several commits; a file with more memories than that is still committed whole."""
    store = make_store(tmp_path / "m", {"inbox": {"max_batch": 20}})
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        inbox = store / "inbox"
        expected = []
        for i in range(30):  # 30 files of 3 memories
            items = [{"content": f"burst file {i} note {k} about the garden"} for k in range(3)]
            expected += [x["content"] for x in items]
            (inbox / ".tmp" / f"f{i:02d}.json").write_text(json.dumps(items))
        big = [{"content": f"one big file, note {k} about the office"} for k in range(50)]
        expected += [x["content"] for x in big]
        (inbox / ".tmp" / "big.json").write_text(json.dumps(big))
        for p in sorted((inbox / ".tmp").iterdir()):
            os.rename(p, inbox / p.name)
        wait_for(lambda: len(head_contents(store)) == len(expected), 60, "the burst committed")
        subjects = git(store, "log", "--format=%s", "--grep=^ingest: ").splitlines()
        sizes = [int(s.split()[1]) for s in subjects if s.endswith("from inbox")]
        assert sum(sizes) == len(expected) and sorted(head_contents(store)) == sorted(expected)
        assert 50 in sizes or any(n > 50 for n in sizes)  # the big file: whole, in one
        small = [n for n in sizes if n < 50]
        # each commit of small files stops at the first file that brings it to 20
        assert len(small) >= 4 and all(n <= 20 + 2 for n in small), sizes
    finally:
        d.stop()
