from __future__ import annotations

import dataclasses
import functools
import os
import typing
from pathlib import Path

import pytest
import yaml
from helpers import git

from clagd.config import Config, load_config
from clagd.errors import ConfigError, StoreError
from clagd.model import Cluster, Memory, memory_id
from clagd.store.create import init_store, template_dir
from clagd.store.durable import atomic_write_text
from clagd.store.files import Paths, load_state, write_cluster
from clagd.yamlio import YamlError, dumps, loads


def test_init_creates_layout_repo_and_first_commit(tmp_path: Path) -> None:
    root, created = init_store(tmp_path / "m")
    assert created
    for d in ("clusters", "archive", "unsorted", "prompts", "inbox", "inbox/rejected", ".clagd"):
        assert (root / d).is_dir(), d
    assert (root / "clagd.yaml").is_file() and (root / "README.md").is_file()
    assert oct((root / ".clagd").stat().st_mode & 0o777) == "0o700"
    log = git(root, "log", "--format=%s%n%b")
    assert "init: new clagd store" in log and "Clagd-Kind: init" in log
    assert git(root, "config", "core.fsync").strip() == "all"
    # inbox/ and .clagd/ are not history
    (root / "inbox" / "x.txt").write_text("hello")
    (root / ".clagd" / "stats.json").write_text("{}")
    assert git(root, "status", "--porcelain") == ""
    root2, created2 = init_store(root)
    assert root2 == root and not created2


def test_template_config_shows_exactly_the_defaults() -> None:
    assert load_config(template_dir()) == Config()

    def keys(d: dict, prefix: str = "") -> set[str]:
        out = set()
        for k, v in d.items():
            out |= keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
        return out

    shown = keys(yaml.safe_load((template_dir() / "clagd.yaml").read_text()))
    assert shown == keys(Config().to_dict()), "store_template/clagd.yaml must show every key"


def test_config_errors_name_the_key_and_file(tmp_path: Path) -> None:
    (tmp_path / "clagd.yaml").write_text("retrieval:\n  max_memories: many\n")
    with pytest.raises(ConfigError, match=r"clagd.yaml.*retrieval.max_memories"):
        load_config(tmp_path)
    (tmp_path / "clagd.yaml").write_text("retrieval:\n  max_memorys: 3\n")
    with pytest.raises(ConfigError, match="unknown key 'retrieval.max_memorys'"):
        load_config(tmp_path)
    (tmp_path / "clagd.yaml").write_text("backend:\n  kind: gpt\n")
    with pytest.raises(ConfigError, match="backend.kind"):
        load_config(tmp_path)
    (tmp_path / "clagd.yaml").write_text("inbox:\n  settle_seconds: 2\n")
    assert load_config(tmp_path, env={"CLAGD_BACKEND": "none"}).backend.kind == "none"
    assert load_config(tmp_path).inbox.settle_seconds == 2.0


def _literal_settings() -> dict[str, tuple[str, ...]]:
    """Every setting typed as a Literal in Config (dotted key -> allowed values)."""
    out: dict[str, tuple[str, ...]] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            t = hints[f.name]
            if dataclasses.is_dataclass(t):
                walk(t, f"{prefix}{f.name}.")
            elif typing.get_origin(t) is typing.Literal:
                out[prefix + f.name] = typing.get_args(t)

    walk(Config, "")
    return out


def _yaml_setting(key: str, value: str) -> str:
    """clagd.yaml text setting one dotted key."""
    doc: typing.Any = value
    for part in reversed(key.split(".")):
        doc = {part: doc}
    return yaml.safe_dump(doc)


def test_fixed_choice_settings_are_checked_by_the_loader(tmp_path: Path) -> None:
    choices = _literal_settings()
    assert {"backend.kind", "retrieval.idf", "inbox.observer"} <= set(choices)
    path = tmp_path / "clagd.yaml"
    for key, allowed in choices.items():
        for value in allowed:
            path.write_text(_yaml_setting(key, value))
            cfg = load_config(tmp_path, env={})
            assert functools.reduce(getattr, key.split("."), cfg) == value
        path.write_text(_yaml_setting(key, "no-such-choice"))
        with pytest.raises(ConfigError) as err:
            load_config(tmp_path, env={})
        assert str(path) in str(err.value) and f"'{key}'" in str(err.value)
        assert all(v in str(err.value) for v in allowed) and "no-such-choice" in str(err.value)
    with pytest.raises(
        ConfigError, match="environment CLAGD_BACKEND: 'backend.kind' must be one of"
    ):
        load_config(None, env={"CLAGD_BACKEND": "gpt"})


def test_memory_id_is_the_hash_of_normalized_content() -> None:
    assert memory_id("hello  world\n") == memory_id(" hello world")
    assert memory_id("hello world") != memory_id("Hello world")
    m = Memory.new("  a\tmemory ")
    assert m.content == "a memory" and m.id == memory_id("a memory")


def test_cluster_yaml_is_readable_with_stable_key_order(tmp_path: Path) -> None:
    root, _ = init_store(tmp_path / "m")
    c = Cluster(
        "c-0123456789ab",
        "User comfort preferences",
        "How the user likes the flat.",
        ["home"],
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00Z",
        [Memory.new("likes it warm", "2026-01-01T00:00:00Z", {"importance": 0.8})],
    )
    path = write_cluster(Paths(root), c)
    text = path.read_text()
    keys = [
        line.split(":")[0] for line in text.splitlines() if line and not line.startswith((" ", "-"))
    ]
    assert keys == ["id", "name", "description", "tags", "created_at", "updated_at", "memories"]
    assert "likes it warm" in text
    assert load_state(root).clusters[c.id] == c


def test_load_reports_every_broken_file(tmp_path: Path) -> None:
    root, _ = init_store(tmp_path / "m")
    m = Memory.new("one")
    write_cluster(Paths(root), Cluster("c-00000000aa", "A b", memories=[m]))
    write_cluster(Paths(root), Cluster("c-00000000bb", "C d", memories=[m]))
    (root / "clusters" / "c-00000000cc.yaml").write_text("id: c-00000000cc\nmemories: [\n")
    (root / "clusters" / "c-00000000dd.yaml").write_text("id: c-0000000999\nname: x\n")
    with pytest.raises(StoreError) as exc:
        load_state(root)
    msg = str(exc.value)
    assert "also in" in msg and "c-00000000cc.yaml" in msg and "does not match the file name" in msg


def test_yaml_refuses_aliases_and_writes_atomically(tmp_path: Path) -> None:
    bomb = "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"
    with pytest.raises(YamlError, match="aliases"):
        loads(bomb)
    assert loads(dumps({"k": "ünïcode", "n": [1, 2]})) == {"k": "ünïcode", "n": [1, 2]}
    target = tmp_path / "f.yaml"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["f.yaml"]  # no temp file left


def test_yaml_uses_the_c_loader_when_present() -> None:
    from clagd import yamlio

    if yaml.__with_libyaml__:
        assert yamlio._Loader is yaml.CSafeLoader and yamlio._Dumper is yaml.CSafeDumper


def test_store_files_stay_inside_the_store(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    for bad in ("../../etc/passwd", "c-../../x", "/abs", "c-zz"):
        with pytest.raises(StoreError):
            paths.cluster_file(bad)
    with pytest.raises(StoreError):
        paths.shard_file("../u-x")
    assert not os.path.exists(tmp_path / "etc")


def test_cached_memory_fragments_write_exactly_what_a_full_dump_writes() -> None:
    import random

    from clagd.store.files import Fragments, _memories_yaml, cluster_yaml

    rnd = random.Random(1)
    cache = Fragments()
    picked: set[str] = set()
    mems = [
        Memory.new(
            "x" * rnd.randint(1, 250) + f" '\"é: - # {i}" + ("\nline" if i % 3 else ""),
            "2026-01-01T00:00:00Z",
            {"importance": 0.5, "merged": [{"a": i}]} if i % 2 else {},
        )
        for i in range(40)
    ]
    for t in range(60):
        pick = rnd.sample(mems, rnd.randint(0, 6))
        picked.update(m.id for m in pick)
        c = Cluster(
            "c-0123456789ab",
            "Name: x",
            "d",
            ["t"],
            "a",
            "b",
            pick,
            pinned=bool(t % 2),
            supersedes={"m-1": "m-2"} if t % 3 == 0 else {},
        )
        assert cluster_yaml(c, cache) == dumps(c.to_dict())
        assert _memories_yaml({}, pick, cache) == dumps({"memories": [m.to_dict() for m in pick]})
    assert len(cache) == len(picked)  # each picked memory's text was kept, and reused
    # a memory changed in place (metadata appended to) is dumped again, not served stale
    m = mems[1]
    before = cluster_yaml(Cluster("c-0123456789ab", "N a", memories=[m]), cache)
    m.metadata["merged"].append({"b": 2})
    after = cluster_yaml(Cluster("c-0123456789ab", "N a", memories=[m]), cache)
    assert after != before and after == dumps(
        Cluster("c-0123456789ab", "N a", memories=[m]).to_dict()
    )


def test_list_items_are_exactly_the_items_of_one_dump_each() -> None:
    """One dump of many memories, split at the items, equals dumping each on its own, for
    contents that look like list items, blank lines, long words, control characters, and
    metadata objects shared between memories (no alias may tie one item to another)."""
    from clagd.yamlio import list_items

    shared = {"tags": ["a", "b"], "n": 1}
    contents = [
        "- looks like an item",
        "first line\n- second line starts like an item\n\n- and after a blank line",
        "  leading spaces, trailing spaces  ",
        "x" * 300 + " " + "y " * 120,
        "tab\there, bell\x07, nul-free, é ü 中文 🙂, a: b, # not a comment, 'q' \"dq\"",
        "",
        "---\n...\n- - -",
        "|\n  literal-looking\n>",
    ]
    items = []
    for i, text in enumerate(contents * 3):
        m = Memory.new(f"{text} {i}" if text else text, "2026-01-01T00:00:00Z")
        d = m.to_dict()
        if i % 2:
            d["metadata"] = shared  # the same object in many items
        items.append(d)
    got = list_items(items)
    assert got is not None
    assert got == [dumps([d]) for d in items]
    assert "&id" not in "".join(got) and all(loads(t) for t in got)
    assert list_items([]) == []


# every kind of node the fast construction path builds itself or hands back to PyYAML
_YAML_DOCS = [
    "a: 1\nb: 2.5\nc: true\nd: null\ne: 2024-01-01\nf: 2024-01-01T00:00:00Z\ng: '1'\n",
    "h: [1, x, {y: z}, [], {}]\ni: ''\nj: ~\nk: .inf\nl: 0x1F\nm: yes\nn: '012'\n",
    "<<: {a: 1, b: 0}\nb: 2\n",
    "base:\n  x: 1\nmerged:\n  <<: {x: 2}\n  y: [a, {<<: {q: 1}, r: 2}]\n",
    "!!set {a, b}\n",
    "- !!binary aGVsbG8=\n- !!str 12\n- !!int '7'\n- !!float '1'\n- ! 12\n",
    "x: !!omap [a: 1, b: 2]\ny: !!pairs [a: 1, a: 2]\n",
    "a: b\na: c\n",
    "1: one\n2.5: two\nnull: three\ntrue: four\n",
    "content: |\n  two\n  lines\nfolded: >\n  one\n  line\n",
    "",
    "- plain text with: colons and # not a comment\n- 'it''s'\n- \"tab\\tescape\"\n",
]


@pytest.mark.parametrize("doc", _YAML_DOCS)
def test_fast_loader_builds_what_the_safe_loader_builds(doc: str) -> None:
    expected = yaml.load(doc, Loader=yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)
    assert loads(doc) == expected
    assert type(loads(doc)) is type(expected)


def test_fast_loader_refuses_unhashable_keys_and_matches_a_dumped_cluster() -> None:
    with pytest.raises(YamlError, match="unhashable key"):
        loads("? [1, 2]\n: x\n")
    c = Cluster(
        "c-00000001",
        "Trip planning",
        "plans: dates, 'quotes' and 2024-05-01",
        ["travel", "123", "true"],
        memories=[
            Memory.new(
                "Flight on 2024-05-01 at 10:00", metadata={"importance": 0.9, "n": [1, None]}
            ),
            Memory.new("yes", metadata={"when": "2024-01-01T00:00:00Z"}),
        ],
    )
    text = dumps(c.to_dict())
    assert loads(text) == yaml.safe_load(text)
    assert Cluster.from_dict(loads(text)) == c


def test_yaml_nested_deeper_than_the_stack_is_a_yaml_error() -> None:
    # deeper than Python's recursion limit, shallower than libyaml's own 1000-level limit:
    # a clear YamlError (the inbox rejects the file with it), not a RecursionError
    with pytest.raises(YamlError, match="nested too deeply"):
        loads("a: " + "[" * 900 + "]" * 900)
    nested = loads("a: " + "[" * 50 + "]" * 50)["a"]
    for _ in range(49):
        (nested,) = nested
    assert nested == []


def test_removed_between_commits_counts_moves_into_added_files(tmp_path: Path) -> None:
    """The memories a move of the branch took out of the store: a memory moved into a file
    the move added is not removed; a file the move added held nothing before."""
    from clagd.store.history import removed_between

    root, _ = init_store(tmp_path / "s")
    paths = Paths(root)
    empty = git(root, "rev-parse", "HEAD").strip()
    a, b, c = (Memory.new(t, "2024-01-01T00:00:00Z") for t in ("apple", "banana", "cherry"))
    write_cluster(paths, Cluster("c-00000001", "Fruit", memories=[a, b]))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "two")
    two = git(root, "rev-parse", "HEAD").strip()
    assert removed_between(root, empty, two) == set()  # only files added: nothing to lose
    (root / "clusters" / "c-00000001.yaml").unlink()
    write_cluster(paths, Cluster("c-00000002", "Moved", memories=[a, c]))  # an added file
    git(root, "add", "-A")
    git(root, "commit", "-qm", "moved")
    moved = git(root, "rev-parse", "HEAD").strip()
    assert removed_between(root, two, moved) == {b.id}
    assert removed_between(root, moved, two) == {c.id}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_load_keeps_each_memory_s_file_text_for_the_next_rewrite(
    tmp_path: Path, workers: int
) -> None:
    """After a start from the files, the fragment cache holds each hot memory's text as its
    file has it (from the loader's own processes too), so a cluster that one routed memory
    joins is rewritten without dumping its other memories again; the file's bytes are the
    same as a full dump. A file laid out another way gives nothing; one in clagd's layout
    with its own quoting gives its own text, which parses to the same memory."""
    from clagd.engine.loader import load_store
    from clagd.store import files

    root, _ = init_store(tmp_path / "m")
    mems = [
        Memory.new(f"memory {i}: '#' - x", "2026-01-01T00:00:00Z", {"k": [i]} if i % 2 else {})
        for i in range(30)
    ]
    for j in range(4):
        write_cluster(Paths(root), Cluster(f"c-0000000{j}", f"Cluster {j}", memories=mems[j::4]))
    hand = Memory.new("written by hand", "2026-01-01T00:00:00Z")
    (root / "clusters" / "c-000000a1.yaml").write_text(
        f"id: c-000000a1\nname: Hand made\nmemories:\n  # mine\n  - id: {hand.id}\n"
        f"    content: {hand.content}\n    created_at: '2026-01-01T00:00:00Z'\n"
    )
    quoted = Memory.new("double quoted", "2026-01-01T00:00:00Z")
    own = f'- id: {quoted.id}\n  content: "double quoted"  # a comment\n  created_at: "2026-01-01T00:00:00Z"\n'
    (root / "clusters" / "c-000000a2.yaml").write_text(
        f"id: c-000000a2\nname: Quoted\nmemories:\n{own}"
    )
    cache = files.Fragments()
    state = load_store(root, workers=workers, fragments=cache).state
    for m in mems:
        got = cache.get(m.id)
        assert got is not None and got[3] == dumps([m.to_dict()])
    assert cache.get(hand.id) is None
    got = cache.get(quoted.id)
    assert got is not None and got[3] == own
    q = state.clusters["c-000000a2"]
    text = files.cluster_yaml(q, cache)
    assert text.endswith(own) and Cluster.from_dict(loads(text)) == q
    assert files.cluster_yaml(q) != text  # without the store's cache: dumped
    c = state.clusters["c-00000001"]
    c.memories.append(Memory.new("a routed memory joins", "2026-01-02T00:00:00Z"))
    assert files.cluster_yaml(c, cache) == dumps(c.to_dict())
    c.memories[0].metadata["changed"] = "since the load"  # dumped again, not served stale
    assert files.cluster_yaml(c, cache) == dumps(c.to_dict())


def test_two_stores_in_one_process_share_no_file_texts_or_listings(tmp_path: Path) -> None:
    """The caches of a store's files belong to its engine: a memory with the same id in two
    stores is written in each with that store's own text (here store A's file has a comment
    in the memory's list item, which store B must never be given), and one store's ignored
    files are not the other's."""
    from clagd.engine.core import Engine

    memory = Memory.new("the same memory in both stores", "2026-01-01T00:00:00Z")
    own = (
        f"- id: {memory.id}\n  content: the same memory in both stores  # store A's secret\n"
        "  created_at: '2026-01-01T00:00:00Z'\n"
    )
    roots = []
    for name in ("a", "b"):
        root, _ = init_store(tmp_path / name)
        if name == "a":
            (root / "clusters" / "c-0000000a.yaml").write_text(
                f"id: c-0000000a\nname: Shared memory\nmemories:\n{own}"
            )
            (root / "clusters" / "notes.md").write_text("store A's notes\n")
        else:
            write_cluster(Paths(root), Cluster("c-0000000a", "Shared memory", memories=[memory]))
        git(root, "add", "-A")
        git(root, "commit", "-qm", "a cluster")
        roots.append(root)

    def rename(ctx: typing.Any, name: str) -> None:
        ctx.touch_cluster("c-0000000a")
        ctx.state.clusters["c-0000000a"].name = name
        ctx.commit(f"rename to {name}")

    engines = [Engine(root) for root in roots]
    try:
        for eng in engines:
            eng.writer.call(rename, "Renamed memory")
        text_a, text_b = (r.joinpath("clusters", "c-0000000a.yaml").read_text() for r in roots)
        assert text_a.endswith(own)  # store A's own text, from its cache
        assert "secret" not in text_b and text_b.endswith(dumps([memory.to_dict()]))
        assert engines[0].status().ignored_files == ("clusters/notes.md",)
        assert engines[1].status().ignored_files == ()
        assert engines[0].fragments is not engines[1].fragments
    finally:
        for eng in engines:
            eng.close()


def test_block_list_texts_takes_only_the_layout_clagd_writes() -> None:
    from clagd.yamlio import block_list_texts, list_items

    items = [{"id": f"m-{i}", "content": f"- {i}: #", "metadata": {"a": [1, 2]}} for i in range(5)]
    doc = dumps({"id": "c-1", "tags": ["x"], "memories": items})
    assert block_list_texts(doc, "memories", 5) == list_items(items)
    assert block_list_texts(dumps({"memories": items}), "memories", 5) == list_items(items)
    for other in [
        doc.replace("\n- id: m-1", "\n# a note\n- id: m-1"),  # a comment at the margin
        doc + "name: after the list\n",  # another key after it
        doc.replace("\n  content", "\n\n  content", 1),  # a blank line
        doc.replace("\n", "\r\n"),
        doc.rstrip("\n"),
        dumps({"memories": [{"id": "m-1"}]}).replace("- ", "  - "),  # an indented list
        "memories: [{id: m-1}]\n",
    ]:
        assert block_list_texts(other, "memories", len(loads(other)["memories"])) is None
    assert block_list_texts(doc, "memories", 4) is None  # not one part per item
    assert block_list_texts("id: x\n", "memories", 1) is None


def test_is_data_path_splits_as_pathlib_would() -> None:
    """`status` asks is_data_path of every file in the memory folders, so it splits the
    path as a string; for every spelling it must answer what the pathlib rule answers."""
    import itertools

    from clagd.store.files import _is_data_path_slow, is_data_path

    parts = ["clusters", "archive", "unsorted", "prompts", "", ".", "..", "c-0000aaaa.yaml"]
    parts += ["u-20260101T000000-aaaaaa.yaml", "u-x y.yaml", ".yaml", "c-1.yaml", "c-0000AAAA.yaml"]
    parts += [
        "c-0000aaaa.yml",
        "c-0000aaaa.yaml~",
        ".c-0000aaaa.yaml.swp",
        ".c-0000aaaa.yaml",
        ".u-20260101T000000-aaaaaa.yaml",
        "u-" + "a" * 90 + ".yaml",
    ]
    seen = set()
    for k in (1, 2, 3):
        for combo in itertools.product(parts, repeat=k):
            for sep in ("/", "//"):
                rel = sep.join(combo)
                for r in (rel, rel + "/", "/" + rel, "./" + rel):
                    assert is_data_path(r) == _is_data_path_slow(r), r
                    seen.add(is_data_path(r))
    assert seen == {True, False}
    assert is_data_path("clusters/c-0000aaaa.yaml") and is_data_path("./clusters/c-0000aaaa.yaml")
    assert not is_data_path("clusters/c-0000aaaa.yaml~")


def test_the_ignored_files_listing_is_made_again_whenever_a_folder_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status` lists the memory folders' other files on every call; a folder is listed
    again only when its mtime moved, and always while that mtime is too recent to trust."""
    import time

    from clagd.store import files

    root, _ = init_store(tmp_path / "m")
    listed: list[str] = []
    real = os.listdir

    def counting(path: str) -> list[str]:
        listed.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(files.os, "listdir", counting)
    listing = files.IgnoredFiles(root)
    old = time.time() - 60
    for d in ("clusters", "archive", "unsorted"):
        os.utime(root / d, (old, old))
    assert listing.files() == []
    assert sorted(listed) == ["archive", "clusters", "unsorted"]
    listed.clear()
    assert listing.files() == [] and listed == []  # nothing changed: no listing
    (root / "clusters" / "notes.md").write_text("a person's notes\n")
    assert listing.files() == ["clusters/notes.md"] and listed == ["clusters"]
    listed.clear()
    # changed just now: listed at every call, a second change in the same clock tick
    # could leave the folder's mtime as it is
    (root / "unsorted" / "export.yaml").write_text("x: 1\n")
    for _ in range(2):
        assert listing.files() == ["clusters/notes.md", "unsorted/export.yaml"]
    assert listed.count("unsorted") == 2
    assert listing.files(limit=1) == ["clusters/notes.md"]
