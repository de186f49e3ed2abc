from datetime import datetime, timedelta, timezone

from clagd.config import SessionConfig
from clagd.model import Cluster, Memory
from clagd.organize.lexical import organize, organize_all

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)

TOPICS = {
    "garden": "tomatoes garden watering soil compost seedlings greenhouse harvest",
    "car": "car engine mechanic brakes tires oil garage repair",
    "piano": "piano lesson scales chords recital teacher practice sheet",
}


def _mem(text: str, at: datetime) -> Memory:
    return Memory.new(text, created_at=at.strftime("%Y-%m-%dT%H:%M:%SZ"))


RECITAL = "piano recital stage nerves audience bow applause flowers"


def _episode(topic: str, start: datetime, n: int) -> list[Memory]:
    words = (TOPICS[topic] if topic in TOPICS else RECITAL).split()
    return [
        _mem(
            f"note {i} on {topic}: {words[i % len(words)]} {words[(i + 3) % len(words)]}",
            start + timedelta(seconds=30 * i),
        )
        for i in range(n)
    ]


def _three_episodes(n: int = 8) -> list[Memory]:
    return (
        _episode("garden", T0, n)
        + _episode("car", T0 + timedelta(days=2), n)
        + _episode("piano", T0 + timedelta(days=5), n)
    )


def _check_names(names: list[str]) -> None:
    assert len(set(n.lower() for n in names)) == len(names)
    for n in names:
        assert 2 <= len(n.split()) <= 5, n


def test_every_sampled_memory_assigned_once_and_episodes_kept_together():
    mems = _three_episodes()
    plan = organize(mems, [], SessionConfig())
    assert set(plan.assign) == {m.id for m in mems}
    refs = {pc.ref for pc in plan.clusters}
    assert set(plan.assign.values()) <= refs
    assert len(plan.clusters) == 3
    for topic in TOPICS:
        assert len({plan.assign[m.id] for m in mems if f"on {topic}" in m.content}) == 1
    _check_names([pc.name for pc in plan.clusters])
    for pc in plan.clusters:
        assert pc.ref.startswith("new:")
        assert pc.description.endswith(".") and pc.tags


def test_names_say_what_the_cluster_is_about():
    plan = organize(_three_episodes(), [], SessionConfig())
    joined = " ".join(pc.name.lower() for pc in plan.clusters)
    assert "garden" in joined and "car" in joined and "piano" in joined


def test_size_limit_splits_long_episodes():
    cfg = SessionConfig(max_cluster_size=10, target_cluster_size=6, min_cluster_size=2)
    mems = _episode("garden", T0, 30)
    clusters = organize_all(mems, cfg)
    assert sum(len(c.memories) for c in clusters) == 30
    assert all(len(c.memories) <= 10 for c in clusters)
    _check_names([c.name for c in clusters])


def test_oversized_existing_cluster_is_split():
    cfg = SessionConfig(max_cluster_size=10, target_cluster_size=6)
    mems = _episode("car", T0, 16)
    big = Cluster("c-00000000aa", "Car Repairs", "Car things.", ["car"], memories=mems)
    plan = organize(mems, [big], cfg)
    assert set(plan.assign) == {m.id for m in mems}
    kept = sum(1 for ref in plan.assign.values() if ref == big.id)
    assert kept <= 10
    assert any(ref.startswith("new:") for ref in plan.assign.values())
    _check_names([pc.name for pc in plan.clusters])


def test_new_memories_continue_the_cluster_they_belong_to():
    old = _episode("piano", T0, 5)
    cl = Cluster("c-00000000bb", "Piano Lessons", "Piano.", ["piano"], memories=old)
    new = [_mem("piano recital chords practice with teacher", T0 + timedelta(minutes=5))]
    plan = organize(new, [cl], SessionConfig())
    assert plan.assign == {new[0].id: cl.id}
    assert [pc.name for pc in plan.clusters] == ["Piano Lessons"]


def test_near_duplicate_clusters_merge():
    a = _episode("garden", T0, 4)
    b = _episode("garden", T0 + timedelta(days=3), 4)
    ca = Cluster("c-00000000c1", "Garden Notes", memories=a)
    cb = Cluster("c-00000000c2", "Garden Diary", memories=b)
    plan = organize(a[:1] + b[:1], [ca, cb], SessionConfig(merge_similarity=0.8))
    merged = [pc for pc in plan.clusters if pc.merge_from]
    assert len(merged) == 1
    assert {merged[0].ref, *merged[0].merge_from} == {ca.id, cb.id}


def test_empty_sample_gives_empty_plan():
    plan = organize([], [], SessionConfig())
    assert plan.clusters == [] and plan.assign == {}
    assert organize_all([], SessionConfig()) == []


def test_distinct_names_for_similar_episodes():
    mems = []
    for d in range(6):
        mems += [
            _mem(f"day {d}: {m.content}", T0 + timedelta(days=d, seconds=i))
            for i, m in enumerate(_episode("garden", T0, 3))
        ]
    clusters = organize_all(mems, SessionConfig(merge_similarity=1.01))
    assert len(clusters) == 6
    _check_names([c.name for c in clusters])


def test_a_routed_run_goes_back_to_its_episode():
    # ingest routed part of a new episode into an older cluster on the same topic; the rest
    # of the episode is unsorted. The next session puts the episode back together.
    old = _episode("piano", T0, 6)
    cl = Cluster("c-00000000cc", "Piano Lessons", "Piano.", ["piano"], memories=list(old))
    day = T0 + timedelta(days=3)
    episode = _episode("recital", day, 6)
    routed, loose = episode[:3], episode[3:]
    cl.memories.extend(routed)
    plan = organize(loose + routed, [cl], SessionConfig())
    homes = {plan.assign[m.id] for m in episode}
    assert len(homes) == 1 and homes != {cl.id}  # one cluster, not the old one
    assert not any(m.id in plan.assign for m in old)


def test_a_routed_run_without_unsorted_company_stays():
    old = _episode("piano", T0, 6)
    routed = _episode("piano", T0 + timedelta(days=3), 3)
    cl = Cluster("c-00000000cd", "Piano Lessons", "Piano.", ["piano"], memories=old + routed)
    plan = organize(routed, [cl], SessionConfig())
    assert {plan.assign.get(m.id, cl.id) for m in routed} == {cl.id}


def test_an_unsampled_member_keeps_its_run_in_place():
    # only the members of a run the session sampled in full may move
    old = _episode("piano", T0, 6)
    day = T0 + timedelta(days=3)
    episode = _episode("piano", day, 6)
    routed, loose = episode[:3], episode[3:]
    cl = Cluster("c-00000000ce", "Piano Lessons", "Piano.", ["piano"], memories=old + routed)
    plan = organize(loose + routed[1:], [cl], SessionConfig())
    assert {plan.assign.get(m.id, cl.id) for m in routed} == {cl.id}
