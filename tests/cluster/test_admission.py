"""Capacity admission (orchestration/admission.py) on a stand-in run storage, and the launcher's
refusal of a run that does not fit where there is no run queue to wait in (the queue itself:
test_capacity_admission.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from dagster._core.errors import DagsterLaunchFailedError
from dagster._core.storage.dagster_run import DagsterRunStatus
from dagster._core.storage.tags import PRIORITY_TAG as DAGSTER_PRIORITY_TAG
from dagster._core.test_utils import create_run_for_test, instance_for_test
from hypothesis import given
from hypothesis import strategies as st

from marin_assets.cluster.fleet import fleet_from_dict
from marin_assets.cluster.routing import Placement
from marin_assets.cluster.tags import PLACEMENT_TAG, JobRequest, classify_tags
from marin_assets.orchestration.admission import CapacityAdmission, candidate_pools, parse_placement, placement_tag
from marin_assets.orchestration.run_queue import queue_tags

FLEET = {
    "pools": [
        {"name": "racks", "accelerator": "gb200-nvl72", "region": "us-central1", "domains": 2},
        {"name": "slices", "accelerator": "tpu-v5e", "region": "us-west4", "domains": 2, "topology": "2x2"},
        {"name": "east-slices", "accelerator": "tpu-v5e", "region": "us-east5", "domains": 1, "topology": "2x2"},
    ]
}
STARTED, SUCCESS = DagsterRunStatus.STARTED, DagsterRunStatus.SUCCESS


class Storage:
    """The two calls admission makes on a DagsterInstance: in-flight runs, and tag writes."""

    def __init__(self):
        self.runs: dict[str, SimpleNamespace] = {}
        self.log: list[tuple] = []

    def add(self, run_id, tags, status=STARTED):
        self.runs[run_id] = SimpleNamespace(run_id=run_id, tags=dict(tags), status=status)

    def get_runs(self, filters):
        return [r for r in self.runs.values() if r.status in filters.statuses]

    def add_run_tags(self, run_id, tags):
        self.log.append(("tag", run_id))
        self.runs[run_id].tags.update(tags)


def gb200(chips, priority="batch"):
    return {"marin/accelerator": "gb200-nvl72", "marin/chips": str(chips), "marin/priority": priority}


def _admit(admission, storage, run_id, tags, pools=frozenset({"racks"}), status=DagsterRunStatus.STARTING):
    """Offer a run as the launcher does: it is in storage (STARTING) while it is admitted."""

    def stop(victim):
        storage.log.append(("stop", victim))
        storage.runs[victim].status = DagsterRunStatus.FAILURE

    storage.add(run_id, tags, status)
    return admission.admit(storage, run_id, classify_tags(tags), pools, stop)


@pytest.fixture
def setup():
    fleet = fleet_from_dict(FLEET)
    return fleet, CapacityAdmission(fleet), Storage()


def test_runs_fill_domains_then_wait_then_take_the_room_a_finished_run_leaves(setup):
    fleet, admission, storage = setup
    assert _admit(admission, storage, "a", gb200(64)).placement.domains == (0,)
    assert _admit(admission, storage, "b", gb200(64)).placement.domains == (1,)  # never 64 + 64 in one rack
    waiting = _admit(admission, storage, "c", gb200(16))
    assert waiting.placement is None and waiting.victims == ()
    assert waiting.reason == "16 x gb200-nvl72 does not fit in pool racks now"
    assert "c" not in admission.router.jobs  # it waits in Dagster's queue, not the router's
    assert json.loads(storage.runs["a"].tags[PLACEMENT_TAG])["chips"] == [64]
    storage.runs["a"].status = SUCCESS
    assert _admit(admission, storage, "c", gb200(16)).placement.domains == (0,)
    assert "a" not in admission.router.jobs  # finished: read from storage, forgotten
    assert admission.view("racks") == [16, 64]


def test_a_higher_band_evicts_a_lower_one_stopping_it_before_its_own_placement_is_written(setup):
    fleet, admission, storage = setup
    _admit(admission, storage, "a", gb200(30))
    _admit(admission, storage, "b", gb200(40, "interactive"))  # best fit: the same rack (70 of 72)
    _admit(admission, storage, "c", gb200(72, "interactive"))
    # Rack 0 frees 16 by evicting the batch run (lowest band first; 30 chips lost), rack 1 only by
    # evicting 72 chips: the cheaper rack wins.
    decision = _admit(admission, storage, "p", gb200(16, "production"))
    assert decision.victims == ("a",) and decision.placement.domains == (0,)
    assert storage.log[-2:] == [("stop", "a"), ("tag", "p")]
    assert admission.view("racks") == [56, 72]  # the victim's chips went to the preemptor, no more
    assert _admit(admission, storage, "i", gb200(20, "interactive")).placement is None  # equal bands never evict


def test_a_restarted_launcher_reads_the_placements_back_and_can_preempt_them(setup):
    fleet, _, storage = setup
    at = Placement("old", "racks", (0,), (64,), 1.0)
    storage.add("old", {**gb200(64), PLACEMENT_TAG: placement_tag(at)})
    storage.add("big", {**gb200(72, "interactive"), PLACEMENT_TAG: placement_tag(Placement("big", "racks", (1,), (72,), 2.0))})
    admission = CapacityAdmission(fleet)  # a fresh router: nothing known but run storage
    assert _admit(admission, storage, "c", gb200(16)).placement is None
    decision = _admit(admission, storage, "p", gb200(16, "production"))
    assert decision.victims == ("old",) and decision.placement.domains == (0,)


def test_the_run_being_admitted_is_not_counted_against_itself(setup):
    fleet, admission, storage = setup
    inherited = placement_tag(Placement("parent", "racks", (0,), (72,), 1.0))  # a retry keeps its parent's tags
    storage.add("r", {**gb200(72), PLACEMENT_TAG: inherited}, DagsterRunStatus.STARTING)
    assert _admit(admission, storage, "r", {**gb200(72), PLACEMENT_TAG: inherited}).placement is not None


def test_a_damaged_placement_in_flight_makes_runs_wait_naming_it(setup):
    fleet, admission, storage = setup
    storage.add("bad", {**gb200(8), PLACEMENT_TAG: '{"pool": "racks", "domains": [5], "chips": [8], "at": 1}'})
    decision = _admit(admission, storage, "c", gb200(8))
    assert decision.placement is None
    assert "run bad: tag marin/placement: domains [5] and chips [8] do not fit pool racks" in decision.reason


def test_pools_restrict_where_a_run_goes(setup):
    fleet, admission, storage = setup
    tpu = {"marin/accelerator": "tpu-v5e", "marin/chips": "4"}
    assert candidate_pools(fleet, JobRequest("tpu-v5e", 4), tpu, ["us-east5"]) == {"east-slices"}
    assert candidate_pools(fleet, JobRequest("tpu-v5e", 4), tpu, []) == {"slices", "east-slices"}
    assert candidate_pools(fleet, JobRequest("tpu-v5e", 4), {**tpu, "marin/pool": "slices"}, []) == {"slices"}
    with pytest.raises(ValueError, match=r"no pool of the fleet in \['us-central1'\] can hold 4 x tpu-v5e"):
        candidate_pools(fleet, JobRequest("tpu-v5e", 4), tpu, ["us-central1"])
    decision = _admit(admission, storage, "t", tpu, pools=frozenset({"east-slices"}))
    assert decision.placement.pool == "east-slices"


@given(pool=st.sampled_from(["racks", "slices"]), domain=st.integers(0, 1), at=st.floats(0, 2e9))
def test_placement_tags_read_back_exactly(pool, domain, at):
    fleet = fleet_from_dict(FLEET)
    chips = 72 if pool == "racks" else 4
    placement = Placement("r", pool, (domain,), (chips,), at)
    assert parse_placement(placement_tag(placement), fleet, run_id="r") == placement


@pytest.mark.parametrize(
    "value, needle",
    [
        ("not json", "is not JSON"),
        ('{"pool": "racks", "domains": [0], "chips": [8]}', "needs the fields"),
        ('{"pool": "racks", "domains": [0], "chips": [8], "at": 1, "x": 2}', "unknown fields ['x']"),
        ('{"pool": "nope", "domains": [0], "chips": [8], "at": 1}', "no pool named 'nope'"),
        ('{"pool": "Racks!", "domains": [0], "chips": [8], "at": 1}', "not a valid name"),
        ('{"pool": "racks", "domains": [0, 0], "chips": [8, 8], "at": 1}', "do not fit pool racks"),
        ('{"pool": "racks", "domains": [0], "chips": [73], "at": 1}', "do not fit pool racks"),
        ('{"pool": "racks", "domains": [true], "chips": [8], "at": 1}', "do not fit pool racks"),
        ('{"pool": "racks", "domains": [0], "chips": [8], "at": NaN}', "is not a finite time"),
        ("[1, 2]", "is not a mapping"),
    ],
)
def test_bad_placement_tags_are_refused_naming_the_run(value, needle):
    with pytest.raises(ValueError, match="run r7: tag marin/placement") as err:
        parse_placement(value, fleet_from_dict(FLEET), run_id="r7")
    assert needle in str(err.value)


def test_the_queue_orders_by_band_and_blanks_an_inherited_placement():
    def tags_added(tags):
        return queue_tags(SimpleNamespace(tags=tags))

    assert tags_added({"marin/priority": "production"}) == {DAGSTER_PRIORITY_TAG: "2"}
    assert tags_added({}) == {DAGSTER_PRIORITY_TAG: "0"}
    assert tags_added({"marin/priority": "interactive", DAGSTER_PRIORITY_TAG: "7"}) == {}  # the user's wins
    assert tags_added({"marin/priority": "urgent"}) == {}  # refused later, by the launcher
    assert tags_added({DAGSTER_PRIORITY_TAG: "0", PLACEMENT_TAG: "{...}"}) == {PLACEMENT_TAG: ""}


def test_without_a_run_queue_a_run_that_does_not_fit_is_refused(tmp_path):
    (tmp_path / "fleet.yaml").write_text("pools:\n  - {name: racks, accelerator: gb200-nvl72, region: us-central1, domains: 1}\n")
    overrides = {
        "run_launcher": {
            "module": "marin_assets.orchestration.launcher",
            "class": "RoutingRunLauncher",
            "config": {"fleet_file": str(tmp_path / "fleet.yaml")},
        },
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
    }
    holder = {**gb200(64), PLACEMENT_TAG: placement_tag(Placement("x", "racks", (0,), (64,), 1.0))}
    with instance_for_test(overrides=overrides) as instance:
        create_run_for_test(instance, job_name="j", tags=holder, status=STARTED)
        run = create_run_for_test(instance, job_name="j", tags=gb200(16))
        with pytest.raises(DagsterLaunchFailedError, match="does not fit in pool racks now, and there is no run queue"):
            instance.launch_run(run.run_id, workspace=None)
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE
