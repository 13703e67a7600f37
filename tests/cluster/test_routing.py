"""Every routing rule: placement, no splitting, queued jobs hold nothing, the ledger race,
priority bands, preemption order, checkpoint resume and failed-node re-submission."""

from __future__ import annotations

import pytest

from marin_assets.cluster.fleet import Fleet, Pool
from marin_assets.cluster.routing import DONE, QUEUED, RUNNING, PoolHeartbeat, Router
from marin_assets.cluster.tags import JobRequest


def gpu_fleet(racks=2, nodes=2):
    return Fleet(
        (
            Pool("gb200", "gb200-nvl72", "us-central1", racks, ep_domain_chips=64),
            Pool("h100", "h100x8", "us-east5", nodes),
        )
    )


def beat(router, now, pool=None):
    """Heartbeat every pool (or one) from the router's own placements, as a healthy fleet would."""
    for p in router.fleet.pools:
        if pool is not None and p.name != pool:
            continue
        used = [0] * p.domains
        running = set()
        for j in router.jobs.values():
            if j.status == RUNNING and j.placement.pool == p.name:
                running.add(j.job_id)
                for d, c in zip(j.placement.domains, j.placement.chips):
                    used[d] += c
        router.heartbeat(PoolHeartbeat(p.name, now, tuple(used), (True,) * p.domains, frozenset(running)))


def req(acc="gb200-nvl72", chips=8, priority="batch", region=None):
    return JobRequest(acc, chips, region, priority)


def test_submit_refuses_jobs_no_pool_can_hold():
    r = Router(gpu_fleet())
    with pytest.raises(ValueError, match="largest matching pool has 144"):
        r.submit("huge", req(chips=145), 0)
    with pytest.raises(ValueError, match="no tpu-v5e pool"):
        r.submit("tpu", req("tpu-v5e", 4), 0)
    with pytest.raises(ValueError, match="no gb200-nvl72 pool in region europe-west4"):
        r.submit("eu", req(region="europe-west4"), 0)
    r.submit("ok", req(), 0)
    with pytest.raises(ValueError, match="already submitted"):
        r.submit("ok", req(), 0)
    assert list(r.jobs) == ["ok"]


def test_nothing_is_placed_before_a_pools_first_heartbeat():
    r = Router(gpu_fleet())
    r.submit("a", req(), 0)
    assert r.tick(1).placements == []
    beat(r, 2)
    [p] = r.tick(3).placements
    assert p.pool == "gb200" and p.chips == (8,)


def test_an_8_gpu_job_is_never_split_across_nodes():
    r = Router(gpu_fleet())
    beat(r, 0)
    for i in range(2):  # 4 GPUs used on each H100 node: 8 free in total, but never in one node
        r.submit(f"half{i}", req("h100x8", 4), 0)
    r.tick(1)
    assert sorted(r.jobs[f"half{i}"].placement.domains[0] for i in range(2)) == [0, 0]  # best fit packs
    r.submit("h3", req("h100x8", 4), 1)
    r.tick(2)
    r.submit("eight", req("h100x8", 8), 2)
    r.tick(3)
    # node 0: 8 used; node 1: 4 used -> an 8-GPU job must wait rather than take 4+4.
    assert r.jobs["eight"].status == QUEUED


def test_best_fit_prefers_the_tightest_domain():
    r = Router(gpu_fleet())
    beat(r, 0)
    r.submit("big", req(chips=60), 0)
    r.tick(1)
    r.submit("small", req(chips=8), 1)
    r.tick(2)
    assert r.jobs["small"].placement.domains == r.jobs["big"].placement.domains  # 12 free there


def test_multi_rack_job_takes_whole_racks_of_one_pool():
    r = Router(gpu_fleet(racks=3))
    beat(r, 0)
    r.submit("one-gpu", req(chips=1), 0)
    r.tick(1)
    r.submit("two-racks", req(chips=128), 1)
    [p] = r.tick(2).placements
    assert len(p.domains) == 2 and p.chips == (72, 72)
    assert r.jobs["one-gpu"].placement.domains[0] not in p.domains


def test_tpu_jobs_take_whole_slices():
    fleet = Fleet((Pool("v5e", "tpu-v5e", "us-west4", 2, topology="16x16"),))
    r = Router(fleet)
    beat(r, 0)
    r.submit("small", req("tpu-v5e", 8), 0)
    r.submit("next", req("tpu-v5e", 8), 0)
    r.submit("third", req("tpu-v5e", 8), 0)
    r.tick(1)
    assert r.jobs["small"].placement.chips == (256,)
    assert r.jobs["next"].placement.domains != r.jobs["small"].placement.domains
    assert r.jobs["third"].status == QUEUED


def test_region_constraint_is_respected():
    fleet = Fleet((Pool("a", "h100x8", "us-east5", 1), Pool("b", "h100x8", "europe-west4", 1)))
    r = Router(fleet)
    beat(r, 0)
    r.submit("eu", req("h100x8", 2, region="europe-west4"), 0)
    r.tick(1)
    assert r.jobs["eu"].placement.pool == "b"


def test_queued_jobs_hold_no_capacity():
    r = Router(gpu_fleet(racks=1, nodes=1))
    beat(r, 0)
    r.submit("blocker", req(chips=70), 0)
    r.tick(1)
    r.submit("waits", req(chips=72), 1)  # cannot fit while blocker runs
    r.submit("fits", req(chips=2), 2)  # submitted later, still runs now: 'waits' reserves nothing
    r.tick(2)
    assert r.jobs["waits"].status == QUEUED
    assert r.jobs["fits"].status == RUNNING
    assert r.view(r.fleet.pool("gb200")) == [72]


def test_ledger_two_ticks_between_heartbeats_never_double_book():
    r = Router(gpu_fleet(racks=1, nodes=1))
    beat(r, 0)  # the snapshot says: rack 0 completely free
    r.submit("a", req(chips=64), 0)
    assert [p.job_id for p in r.tick(10).placements] == ["a"]
    r.submit("b", req(chips=64), 11)
    assert r.tick(20).placements == []  # the heartbeat still says 0 used; the ledger says 64
    assert r.jobs["b"].status == QUEUED
    beat(r, 30)  # now the snapshot itself shows a; the ledger entry is dropped, not double counted
    assert r.ledger.entries("gb200") == []
    assert r.view(r.fleet.pool("gb200")) == [64]
    assert r.tick(40).placements == []


def test_without_the_ledger_the_second_tick_double_books():
    # The negative control: the same sequence with the ledger off hands out the slots twice.
    r = Router(gpu_fleet(racks=1, nodes=1), _use_ledger=False)
    beat(r, 0)
    r.submit("a", req(chips=64), 0)
    r.tick(10)
    r.submit("b", req(chips=64), 11)
    assert [p.job_id for p in r.tick(20).placements] == ["b"]


def test_a_heartbeat_taken_before_a_placement_keeps_its_reservation():
    r = Router(gpu_fleet(racks=1, nodes=1))
    beat(r, 0)
    r.submit("a", req(chips=64), 0)
    r.tick(10)
    # A heartbeat whose snapshot predates the placement arrives late: it shows the rack empty.
    r.heartbeat(PoolHeartbeat("gb200", 5, (0,), (True,), frozenset()))
    assert r.jobs["a"].status == RUNNING  # too new to be judged lost
    assert r.view(r.fleet.pool("gb200")) == [64]
    r.submit("b", req(chips=64), 11)
    assert r.tick(20).placements == []


def test_priority_bands_order_the_queue():
    r = Router(gpu_fleet(racks=1, nodes=1))
    r.submit("batch", req(chips=72, priority="batch"), 0)
    r.submit("inter", req(chips=72, priority="interactive"), 1)
    r.submit("prod", req(chips=72, priority="production"), 2)
    beat(r, 3)
    [p] = r.tick(4).placements
    assert p.job_id == "prod"
    assert [j.job_id for j in r.queue()] == ["inter", "batch"]


def test_preemption_takes_lowest_band_then_newest_first():
    ckpt = {}
    r = Router(gpu_fleet(racks=1, nodes=1), newest_checkpoint=lambda j: ckpt.get(j, 0.0))
    beat(r, 0)
    r.submit("b-old", req(chips=24, priority="batch"), 0)
    r.tick(1)
    r.submit("b-new", req(chips=24, priority="batch"), 2)
    r.tick(3)
    r.submit("i-new", req(chips=24, priority="interactive"), 4)
    r.tick(5)
    beat(r, 6)
    ckpt.update({"b-new": 1200.0, "b-old": 600.0})
    r.submit("prod", req(chips=40, priority="production"), 7)
    res = r.tick(8)
    # 0 free; needs 40: evict batch jobs newest first (b-new, then b-old); interactive survives.
    assert [p.victim for p in res.preemptions] == ["b-new", "b-old"]
    assert [p.job_id for p in res.placements] == ["prod"]
    assert r.jobs["i-new"].status == RUNNING
    assert r.jobs["b-new"].status == QUEUED and r.jobs["b-new"].resume_from == 1200.0
    assert r.jobs["b-old"].resume_from == 600.0 and r.jobs["b-old"].preemptions == 1


def test_preemption_stops_as_soon_as_the_job_fits():
    r = Router(gpu_fleet(racks=1, nodes=1))
    beat(r, 0)
    for i, t in enumerate((1, 2, 3)):
        r.submit(f"b{i}", req(chips=24), t)
        r.tick(t)
    r.submit("prod", req(chips=20, priority="production"), 4)
    res = r.tick(5)
    assert [p.victim for p in res.preemptions] == ["b2"]


def test_no_preemption_of_equal_or_higher_bands_or_by_batch():
    r = Router(gpu_fleet(racks=1, nodes=1))
    beat(r, 0)
    r.submit("i", req(chips=72, priority="interactive"), 0)
    r.tick(1)
    r.submit("i2", req(chips=8, priority="interactive"), 2)
    r.submit("b", req(chips=8, priority="batch"), 2)
    res = r.tick(3)
    assert res.preemptions == [] and res.placements == []


def test_preemption_picks_the_domain_losing_fewest_chips():
    r = Router(gpu_fleet(racks=2, nodes=1))
    beat(r, 0)
    r.submit("big", req(chips=72), 0)
    r.tick(1)
    r.submit("small", req(chips=72 - 8), 1)
    r.tick(2)
    r.submit("prod", req(chips=72, priority="production"), 3)
    res = r.tick(4)
    assert [p.victim for p in res.preemptions] == ["small"]
    assert r.jobs["big"].status == RUNNING


def test_preempted_capacity_is_not_handed_out_twice():
    r = Router(gpu_fleet(racks=1, nodes=1))
    beat(r, 0)
    r.submit("b", req(chips=72), 0)
    r.tick(1)
    r.submit("prod", req(chips=64, priority="production"), 2)
    r.submit("filler", req(chips=16), 2)
    res = r.tick(3)
    assert [p.job_id for p in res.placements] == ["prod"]  # 8 left: filler (16) must wait
    assert r.view(r.fleet.pool("gb200")) == [64]
    beat(r, 4)  # the snapshot shows prod only; the release entry is dropped
    assert r.view(r.fleet.pool("gb200")) == [64]
    assert r.tick(5).placements == []


def test_failed_node_tasks_are_resubmitted_from_their_checkpoint():
    r = Router(gpu_fleet(racks=2, nodes=1), newest_checkpoint=lambda j: 900.0)
    beat(r, 0)
    r.submit("a", req(chips=72), 0)
    r.submit("b", req(chips=72), 0)
    r.tick(1)
    dead = r.jobs["a"].placement.domains[0]
    used = [0, 0]
    used[1 - dead] = 72
    healthy = [True, True]
    healthy[dead] = False
    lost = r.heartbeat(PoolHeartbeat("gb200", 30, tuple(used), tuple(healthy), frozenset({"b"})))
    assert lost == ["a"]
    assert r.jobs["a"].status == QUEUED and r.jobs["a"].resume_from == 900.0
    assert r.tick(31).placements == []  # the dead rack is not offered; the other one is busy


def test_finished_jobs_are_marked_done_from_heartbeats():
    r = Router(gpu_fleet(racks=1, nodes=1))
    beat(r, 0)
    r.submit("a", req(chips=8), 0)
    r.tick(1)
    r.heartbeat(PoolHeartbeat("gb200", 30, (0,), (True,), frozenset(), frozenset({"a"})))
    assert r.jobs["a"].status == DONE
    assert r.counts() == {"queued": 0, "running": 0, "done": 1}


def test_multi_rack_production_job_clears_whole_racks_of_lower_bands():
    r = Router(gpu_fleet(racks=3, nodes=1))
    beat(r, 0)
    r.submit("i", req(chips=72, priority="interactive"), 0)
    r.tick(1)
    r.submit("b1", req(chips=40), 2)
    r.submit("b2", req(chips=30), 2)
    r.tick(3)
    r.submit("b3", req(chips=10), 4)
    r.tick(5)
    beat(r, 6)
    r.submit("prod", req(chips=144, priority="production"), 7)
    res = r.tick(8)
    # Racks: one interactive (72); b1+b2 (70) and b3 (10) on the other two. Clearing the two
    # batch racks loses 80 chips; any choice touching the interactive rack would lose more.
    assert sorted(p.victim for p in res.preemptions) == ["b1", "b2", "b3"]
    [p] = res.placements
    assert p.chips == (72, 72) and r.jobs["i"].placement.domains[0] not in p.domains


def test_admit_is_a_tick_of_one_job_and_leaves_the_rest_of_the_queue_alone():
    r = Router(gpu_fleet(racks=1, nodes=1))
    beat(r, 0)
    r.submit("queued", req(chips=8), 0)
    res = r.admit("a", req(chips=64), 1)
    assert [p.job_id for p in res.placements] == ["a"] and r.jobs["queued"].status == QUEUED
    assert r.admit("b", req(chips=16), 2).placements == []  # 8 left; the ledger holds a's 64
    assert r.jobs["b"].status == QUEUED
    res = r.admit("p", req(chips=16, priority="production"), 3)
    assert [p.victim for p in res.preemptions] == ["a"] and res.placements[0].chips == (16,)
    assert r.jobs["a"].preemptions == 1
    res = r.admit("a", req(chips=56), 4)  # offered again (a new attempt): replaces the old state
    assert res.placements[0].chips == (56,) and r.jobs["a"].preemptions == 0


def test_admit_only_onto_the_pools_given():
    fleet = Fleet((Pool("west", "h100x8", "us-west4", 1), Pool("east", "h100x8", "us-east5", 1)))
    r = Router(fleet)
    beat(r, 0)
    assert r.admit("a", req("h100x8", 8), 1, pools=frozenset({"east"})).placements[0].pool == "east"
    assert r.admit("b", req("h100x8", 8), 2, pools=frozenset({"east"})).placements == []
    assert r.admit("c", req("h100x8", 8), 3).placements[0].pool == "west"


def test_adopted_jobs_count_through_heartbeats_and_can_be_preempted():
    from marin_assets.cluster.routing import Placement

    r = Router(gpu_fleet(racks=1, nodes=1))
    r.adopt("old", req(chips=64), Placement("old", "gb200", (0,), (64,), 5.0))
    r.heartbeat(PoolHeartbeat("gb200", 6, (64,), (True,), frozenset({"old"})))
    r.heartbeat(PoolHeartbeat("h100", 6, (0,), (True,), frozenset()))
    assert r.jobs["old"].status == RUNNING and r.admit("b", req(chips=16), 7).placements == []
    assert [p.victim for p in r.admit("p", req(chips=16, priority="production"), 8).preemptions] == ["old"]
    r.withdraw("old")
    r.withdraw("never-seen")  # a no-op
    assert "old" not in r.jobs and r.active() == 2  # b queued, p running
