"""Untyped dicts stay at the JSON edge: `dict[str, Any]` is counted in clagd/ outside the
modules that speak JSON (the socket layer's requests and replies: the server and the
query process; the CLI, the MCP server, the client, the protocol's shared ground, the
eval's JSON data and output)."""

from __future__ import annotations

import re
from pathlib import Path

CLAGD = Path(__file__).resolve().parent.parent / "clagd"
EDGE = (
    "cli/",
    "mcp_server.py",
    "client.py",
    "protocol.py",
    "replies.py",
    "serve/server.py",
    "serve/query_worker.py",
    "eval/",
)
UNTYPED = re.compile(r"\b[Dd]ict\[str, Any\]")
# per 1,000 lines of clagd/ (edge included in the lines): 7.4 (138 of 18,698) before the
# engine's operations and the status sections were typed, 3.95 (76) after. Most of what
# is left is JSON too: the model's JSON schemas and answers (slm/), YAML mappings
# (model.py, config.py), commit trailers.
MAX_PER_1000 = 4.0


def count() -> tuple[int, int]:
    """(occurrences outside the edge, lines of clagd/)."""
    found = lines = 0
    for path in sorted(CLAGD.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines += len(text.splitlines())
        if not path.relative_to(CLAGD).as_posix().startswith(EDGE):
            found += len(UNTYPED.findall(text))
    return found, lines


def test_untyped_dicts_stay_at_the_json_edge() -> None:
    found, lines = count()
    per_1000 = 1000 * found / lines
    assert per_1000 <= MAX_PER_1000, (
        f"{found} dict[str, Any] outside the JSON edge: {per_1000:.2f} per 1,000 lines "
        f"(at most {MAX_PER_1000}); type the seam (a dataclass) instead"
    )


def test_to_wire_is_the_fields_in_order_and_leaves_out_what_is_omitted_while_none() -> None:
    from clagd.engine.results import ClusterScore, MemoryHit, QueryResult
    from clagd.protocol import to_wire

    hit = MemoryHit("m-1", "tea", None, "", 1.5, "2024-01-01T00:00:00Z", {"k": [1, (2, 3)]}, False)
    res = QueryResult((hit,), (ClusterScore("c-1", "drinks", 0.25),), "ctx", 3, 0.5)
    wire = to_wire(res)
    assert wire == {
        "memories": [
            {
                "id": "m-1",
                "content": "tea",
                "cluster_id": None,
                "cluster_name": "",
                "score": 1.5,
                "created_at": "2024-01-01T00:00:00Z",
                "metadata": {"k": [1, [2, 3]]},
                "archived": False,
                "scope": "default",
            }
        ],
        "clusters": [{"id": "c-1", "name": "drinks", "score": 0.25}],
        "context": "ctx",
        "tokens": 3,
        "took_ms": 0.5,
    }
    assert isinstance(wire, dict) and list(wire) == [
        "memories",
        "clusters",
        "context",
        "tokens",
        "took_ms",
    ]
    thawing = to_wire(QueryResult((), (), "", 0, 0.0, thawing=("c-2",)))
    assert isinstance(thawing, dict) and thawing["thawing"] == ["c-2"]
