"""Plans: schema with enumerated aliases, parsing, validation, applying, invariants, size."""

from __future__ import annotations

import pytest

from clagd.model import Cluster, Memory
from clagd.organize.plan import Plan, PlanCluster, PlanError
from clagd.organize.plan_apply import apply_plan
from clagd.organize.plan_checks import validate_plan
from clagd.organize.plan_invariants import check_invariants
from clagd.organize.plan_parse import parse_plan
from clagd.organize.plan_schema import Aliases, build_schema
from clagd.organize.size_policy import size_policy
from clagd.slm.base import schema_errors
from clagd.store.files import StoreState


def mem(text: str, day: int = 1) -> Memory:
    return Memory.new(text, created_at=f"2025-01-{day:02d}T10:00:00Z")


def make_state() -> tuple[StoreState, dict[str, Memory]]:
    m = {
        "cold": mem("User is always cold in the evening", 1),
        "switch": mem("User asked where the heating switch is", 2),
        "anna": mem("Anna is the user's sister", 3),
        "lyon": mem("Anna lives in Lyon", 4),
        "tea": mem("User likes green tea", 5),
    }
    state = StoreState()
    state.clusters["c-aaaaaaaa"] = Cluster(
        "c-aaaaaaaa", "home heating setup", "Heating.", ["heating"], memories=[m["switch"]]
    )
    state.clusters["c-bbbbbbbb"] = Cluster(
        "c-bbbbbbbb", "user drinks", "Drinks.", ["drinks"], memories=[m["tea"]]
    )
    state.unsorted["u-1"] = [m["cold"], m["anna"], m["lyon"]]
    return state, m


def test_schema_enumerates_aliases() -> None:
    s = build_schema(["M1", "M2"], ["C1"], 2)
    assert s["properties"]["assign"]["required"] == ["M1", "M2"]
    assert s["properties"]["assign"]["properties"]["M1"]["enum"] == ["C1", "N1", "N2"]
    good = {"clusters": [], "assign": {"M1": "C1", "M2": "N1"}, "conflicts": [], "reason": ""}
    assert schema_errors(good, s) == []
    assert schema_errors({**good, "assign": {"M1": "C7", "M2": "N1"}}, s)  # invented id
    assert schema_errors({**good, "assign": {"M1": "C1"}}, s)  # dropped memory
    assert (
        "merge" not in build_schema(["M1"], [], 1)["properties"]["clusters"]["items"]["properties"]
    )


def test_parse_maps_aliases_back() -> None:
    al = Aliases.make(["m-1", "m-2", "m-3"], ["c-1"], 2)
    data = {
        "clusters": [
            {"id": "N1", "name": "user family members", "description": "d", "tags": ["x"]},
            {"id": "C1", "name": "renamed cluster", "description": "", "tags": [], "merge": []},
        ],
        "assign": {"M1": "N1", "M2": "C1", "M3": "N1"},
        "conflicts": [{"newer": "M3", "older": "M1"}],
        "reason": "why",
    }
    plan = parse_plan(data, al)
    assert plan.assign == {"m-1": "new:1", "m-2": "c-1", "m-3": "new:1"}
    assert [pc.ref for pc in plan.clusters] == ["new:1", "c-1"]
    assert plan.conflicts == [("m-3", "m-1")]
    with pytest.raises(PlanError, match="unknown cluster id 'C9'"):
        parse_plan({**data, "assign": {"M1": "C9"}}, al)
    with pytest.raises(PlanError, match="unknown memory id 'M9'"):
        parse_plan({**data, "assign": {"M9": "C1"}}, al)
    pairs = [{"memory": "M1", "cluster": "C1"}, {"memory": "M1", "cluster": "N1"}]
    with pytest.raises(PlanError, match="assigned twice"):
        parse_plan({**data, "assign": pairs}, al)
    with pytest.raises(PlanError, match="described twice"):
        parse_plan({**data, "clusters": data["clusters"] + data["clusters"][:1]}, al)


def _ok_plan(m: dict[str, Memory]) -> Plan:
    return Plan(
        clusters=[
            PlanCluster("c-aaaaaaaa", "user comfort preferences", "Comfort at home.", ["comfort"]),
            PlanCluster("new:1", "user family members", "Family.", ["family"]),
        ],
        assign={
            m["cold"].id: "c-aaaaaaaa",
            m["switch"].id: "c-aaaaaaaa",
            m["anna"].id: "new:1",
            m["lyon"].id: "new:1",
        },
        conflicts=[(m["anna"].id, m["lyon"].id)],
        reason="comfort and family",
    )


def test_validate_accepts_good_plan() -> None:
    state, m = make_state()
    sample = [m[k].id for k in ("cold", "switch", "anna", "lyon")]
    assert validate_plan(_ok_plan(m), sample, state) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda p, m: p.assign.pop(m["lyon"].id), "dropped"),
        (lambda p, m: p.assign.__setitem__("m-0000000000000000", "new:1"), "unknown memory"),
        (lambda p, m: p.assign.__setitem__(m["cold"].id, "c-ffffffff"), "unknown cluster"),
        (lambda p, m: p.assign.__setitem__(m["cold"].id, "new:7"), "has no name"),
        (
            lambda p, m: p.clusters.append(PlanCluster("new:2", "empty new cluster")),
            "is empty",
        ),
        (lambda p, m: setattr(p.clusters[1], "name", "User Comfort PREFERENCES"), "duplicate"),
        (lambda p, m: setattr(p.clusters[1], "name", "user drinks"), "duplicate"),
        (lambda p, m: setattr(p.clusters[1], "name", "family"), "2-5 words"),
        (lambda p, m: setattr(p.clusters[1], "name", "one two three four five six"), "2-5 words"),
        (lambda p, m: setattr(p.clusters[1], "name", "x" * 30 + " " + "y" * 40), "longer"),
        (lambda p, m: p.clusters[0].merge_from.append("c-99999999"), "merge of unknown"),
        (
            lambda p, m: (
                p.clusters[0].merge_from.append("c-bbbbbbbb"),
                p.assign.__setitem__(m["cold"].id, "c-bbbbbbbb"),
            ),
            "merged away",
        ),
    ],
)
def test_validate_rejects(change, expected: str) -> None:  # type: ignore[no-untyped-def]
    state, m = make_state()
    plan = _ok_plan(m)
    change(plan, m)
    sample = [m[k].id for k in ("cold", "switch", "anna", "lyon")]
    problems = validate_plan(plan, sample, state)
    assert any(expected in p for p in problems), problems


class Touches:
    def __init__(self, state: StoreState) -> None:
        self.state = state
        self.clusters: set[str] = set()
        self.shards: dict[str, set[str]] = {}

    def touch_cluster(self, cid: str) -> None:
        self.clusters.add(cid)

    def touch_shard(self, name: str) -> None:
        # like the writer: remember the shard as it was before the change
        self.shards.setdefault(name, {x.id for x in self.state.unsorted.get(name, [])})


def test_apply_moves_renames_and_records_conflicts() -> None:
    state, m = make_state()
    before = {x.id for x, _a, _k in state.all_memories()}
    touches = Touches(state)
    applied = apply_plan(state, _ok_plan(m), now="2025-02-01T00:00:00Z", touch=touches)
    new_cid = applied.created["new:1"]
    assert applied.changed == {"c-aaaaaaaa", new_cid} and applied.shards == {"u-1"}
    assert touches.clusters == applied.changed and touches.shards["u-1"] == {
        m["cold"].id,
        m["anna"].id,
        m["lyon"].id,
    }
    assert "u-1" not in state.unsorted  # emptied shard: the writer deletes its file
    assert state.clusters["c-aaaaaaaa"].name == "user comfort preferences"
    assert state.clusters["c-bbbbbbbb"].memories == [m["tea"]]  # untouched
    # recency decides: Lyon (day 4) supersedes the sister fact (day 3)
    assert state.clusters[new_cid].supersedes == {m["lyon"].id: m["anna"].id}
    assert check_invariants(before, state) == []


def test_merge_removes_source_and_emptied_clusters() -> None:
    state, m = make_state()
    before = {x.id for x, _a, _k in state.all_memories()}
    plan = Plan(
        clusters=[PlanCluster("c-bbbbbbbb", "user home life", "", [], ["c-aaaaaaaa"])],
        assign={m["cold"].id: "c-bbbbbbbb"},
    )
    assert validate_plan(plan, [m["cold"].id], state) == []
    applied = apply_plan(state, plan)
    assert applied.removed == {"c-aaaaaaaa"} and "c-aaaaaaaa" not in state.clusters
    assert {x.id for x in state.clusters["c-bbbbbbbb"].memories} == {
        m["tea"].id,
        m["switch"].id,
        m["cold"].id,
    }
    assert check_invariants(before, state) == []
    # moving the only memory out of a cluster removes the emptied cluster
    plan2 = Plan(
        clusters=[PlanCluster("new:1", "user morning drinks")],
        assign={x.id: "new:1" for x in state.clusters["c-bbbbbbbb"].memories},
    )
    applied2 = apply_plan(state, plan2)
    assert "c-bbbbbbbb" in applied2.removed and "c-bbbbbbbb" not in state.clusters


def test_invariants_catch_loss_duplicates_and_empty() -> None:
    state, m = make_state()
    before = {x.id for x, _a, _k in state.all_memories()}
    state.clusters["c-bbbbbbbb"].memories.append(m["cold"])  # duplicated
    state.unsorted["u-1"].remove(m["lyon"])  # lost
    state.clusters["c-cccccccc"] = Cluster("c-cccccccc", "empty one")
    problems = check_invariants(before, state)
    assert any("lost" in p for p in problems)
    assert any(m["cold"].id in p and " and " in p for p in problems)
    assert any("empty" in p for p in problems)


def test_size_policy_split_merge_dedupe() -> None:
    state = StoreState()
    big = [mem(f"gardening note {i} about tomato plants watering", 1) for i in range(6)]
    big += [mem(f"car repair note {i} about engine oil change", 2) for i in range(6)]
    state.clusters["c-11111111"] = Cluster("c-11111111", "mixed notes", "", [], memories=big)
    a = mem("User loves hiking in the alps on weekends")
    b = mem("User loves hiking in the alps on weekends!")  # near-identical (other id)
    c = mem("User hiking alps weekends trips planned")
    state.clusters["c-22222222"] = Cluster("c-22222222", "hiking trips", "", [], memories=[a, b])
    state.clusters["c-33333333"] = Cluster("c-33333333", "alps weekends", "", [], memories=[c])
    before = {x.id for x, _a, _k in state.all_memories()}
    plan = size_policy(state, max_size=8, merge_similarity=0.6, min_size=2)
    assert plan is not None
    assert validate_plan(plan, list(plan.assign), state) == []
    applied = apply_plan(state, plan)
    dropped = [x.id for x in applied.dropped]
    assert len(dropped) == 1
    assert check_invariants(before, state, dropped=dropped) == []
    original = next(x for x in (a, b) if x.id not in dropped)
    kept = state.memory(original.id)
    assert kept is not None and kept.metadata["merged"][0]["content"] in (a.content, b.content)
    # the object an index snapshot may be serving is never changed: the state has a new one
    assert kept is not original and "merged" not in original.metadata
    assert all(len(cl.memories) <= 8 for cl in state.clusters.values())
    assert len(state.clusters) == 3  # mixed split in two, hiking + alps merged
    assert "size policy" in plan.reason


def test_a_model_plan_that_would_mix_scopes_is_refused() -> None:
    """Issue 24: clusters never mix scopes, whatever a model plans. Bob's memory into
    Alice's cluster, one new cluster for both, merging Bob's cluster into Alice's, and a
    conflict or dedupe pairing their memories are each refused, naming the reason; the
    same plan within one scope (a cluster of Bob's named like Alice's) is accepted."""
    a1 = Memory.new("Alice's allergy is peanuts", "2025-01-01T10:00:00Z", scope="alice")
    a2 = Memory.new("Alice's sister is Anna", "2025-01-02T10:00:00Z", scope="alice")
    b1 = Memory.new("Bob's allergy is shellfish", "2025-01-03T10:00:00Z", scope="bob")
    b2 = Memory.new("Bob's sister is Eva", "2025-01-04T10:00:00Z", scope="bob")

    def state() -> StoreState:
        s = StoreState()
        s.clusters["c-aaaaaaaa"] = Cluster(
            "c-aaaaaaaa", "food allergies noted", memories=[a1], scope="alice"
        )
        s.clusters["c-bbbbbbbb"] = Cluster(
            "c-bbbbbbbb", "food allergies noted", memories=[b1], scope="bob"
        )
        s.unsorted["u-1"] = [a2, b2]
        return s

    sample = [a2.id, b2.id]
    fine = Plan(  # the same name twice, once in each scope: two clusters, fine
        clusters=[
            PlanCluster("new:1", "family members known"),
            PlanCluster("new:2", "family members known"),
        ],
        assign={a2.id: "new:1", b2.id: "new:2"},
    )
    assert validate_plan(fine, sample, state()) == []
    bad: list[tuple[Plan, str]] = [
        (
            Plan(assign={a2.id: "c-aaaaaaaa", b2.id: "c-aaaaaaaa"}),
            "cluster c-aaaaaaaa would mix scopes alice, bob",
        ),
        (
            Plan(
                clusters=[PlanCluster("new:1", "family members known")],
                assign={a2.id: "new:1", b2.id: "new:1"},
            ),
            "cluster new:1 would mix scopes alice, bob",
        ),
        (
            Plan(
                clusters=[
                    PlanCluster("c-aaaaaaaa", "food allergies noted", merge_from=["c-bbbbbbbb"])
                ],
                assign={a2.id: "c-aaaaaaaa", b2.id: "c-aaaaaaaa"},
            ),
            "would mix scopes alice, bob",
        ),
        (
            Plan(
                clusters=[PlanCluster("new:1", "family members known"), fine.clusters[1]],
                assign={a2.id: "new:1", b2.id: "new:2"},
                conflicts=[(b2.id, a2.id)],
            ),
            f"conflict pairs memories of two scopes ({b2.id}, {a2.id})",
        ),
    ]
    for plan, why in bad:
        problems = validate_plan(plan, sample, state())
        assert any(why in p for p in problems), (why, problems)


def test_session_checks_rank_a_memory_among_its_own_scopes_clusters() -> None:
    """The session's lexical checks (retrievability, `lexical_ok`) ask what a query of the
    memory's scope would find: another scope's cluster, however well it matches, neither
    outranks the memory's cluster nor makes its assignment look incoherent."""
    from clagd.organize.sample import lexical_ok
    from clagd.organize.similarity import ClusterScores

    a = Memory.new("sourdough starter feeding schedule", "2025-01-01T10:00:00Z", scope="alice")
    a2 = Memory.new("kneading technique for rye loaves", "2025-01-02T10:00:00Z", scope="alice")
    bobs = [
        Memory.new(f"sourdough starter feeding schedule, week {i}", scope="bob") for i in range(5)
    ]
    state = StoreState()
    state.clusters["c-aaaaaaaa"] = Cluster(
        "c-aaaaaaaa", "bread baking notes", memories=[a, a2], scope="alice"
    )
    state.clusters["c-bbbbbbbb"] = Cluster(
        "c-bbbbbbbb", "sourdough starter feeding", memories=bobs, scope="bob"
    )
    scored = ClusterScores(state.clusters)
    assert scored.scores(a.content)["c-bbbbbbbb"] > scored.scores(a.content)["c-aaaaaaaa"]
    assert scored.rank(a.content, "c-aaaaaaaa") == 1  # Bob's is not Alice's to find
    assert set(scored.scores(a.content, "alice")) == {"c-aaaaaaaa"}
    # a memory sharing no word with its cluster, which only another scope's would match
    lone = Memory.new("sourdough starter feeding", scope="alice")
    state.clusters["c-cccccccc"] = Cluster(
        "c-cccccccc", "garden tools list", memories=[lone], scope="alice"
    )
    assert lexical_ok(state, lone.id, "c-cccccccc", ClusterScores(state.clusters)) is False
    del state.clusters["c-aaaaaaaa"]
    assert lexical_ok(state, lone.id, "c-cccccccc", ClusterScores(state.clusters)) is True
