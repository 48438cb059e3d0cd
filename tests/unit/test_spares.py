"""Hot spares (issue 47): the controller's corectl-spares (role slurm) holding a partition's spares, swapping one in
for a node drained for good, taking the repaired node back, once per failure; the drain reason that tells a kept
failure; cluster.yml's pools as the role gets them. The lab's end-to-end test runs it against a real slurmctld."""

from __future__ import annotations

import fcntl
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import pytest

from conftest import ROOT, load_script
from corectl.drain_reason import DrainReason, Source
from corectl.health.coverage import capacity_line, spares_period
from corectl.health.reliability import Outage
from corectl.node_state import spare_reservations
from corectl.site.loader import load_cluster
from corectl.site.render import slurm_vars

KEPT_XID = "corectl-health: xid: GPU 1 (0000:1B:00.0) Xid 79: fallen off the bus (kept)"
PASSING_XID = "corectl-health: clock: not synchronised for 700 s"


def spares_module() -> ModuleType:
    return load_script("corectl_spares", ROOT / "roles" / "slurm" / "files" / "corectl-spares")


class FakeSlurm:
    """slurmctld as corectl-spares sees it: node states and reasons, a partition, reservations, running jobs."""

    def __init__(self, partition: list[str]) -> None:
        self.partition = partition
        self.states = dict.fromkeys(partition, ("IDLE", ""))
        self.held: dict[str, list[str]] = {}
        self.jobs: set[str] = set()
        self.calls: list[tuple[str, ...]] = []

    def drain(self, node: str, reason: str) -> None:
        self.states[node] = ("IDLE+DRAIN", reason)

    def resume(self, node: str) -> None:
        self.states[node] = ("IDLE", "")

    def nodes(self) -> dict[str, dict[str, str]]:
        reserved = {n for nodes in self.held.values() for n in nodes}
        found = {}
        for node, (state, reason) in self.states.items():
            shown = f"{state}+RESERVED" if node in reserved and "DRAIN" not in state else state
            found[node] = {"NodeName": node, "State": shown} | ({"Reason": f"{reason} [root@now]"} if reason else {})
        return found

    def partition_nodes(self, partition: str) -> list[str]:
        assert partition == "batch"
        return list(self.partition)

    def reservations(self) -> dict[str, list[str]]:
        return {name: list(nodes) for name, nodes in self.held.items()}

    def busy(self, node: str) -> bool:
        return node in self.jobs

    def hold(self, reservation: str, nodes: list[str], exists: bool) -> None:
        assert exists == (reservation in self.held), (reservation, exists)
        self.calls.append(("hold", reservation, *sorted(nodes)))
        if nodes:
            self.held[reservation] = sorted(nodes)
        else:
            del self.held[reservation]

    def cancel_ours(self, reservation: str, node: str) -> None:
        self.calls.append(("cancel", reservation, node))
        self.jobs.discard(node)


POOL = {"partition": "batch", "reservation": "corectl_spares_batch", "nodes": ["dgx03"], "repaired": "spare"}


def rounds(cs: ModuleType, slurm: FakeSlurm, state: dict, pools: list[dict] | None = None) -> list[tuple[str, str]]:
    events, errors = cs.one_round(slurm, {"pools": [POOL] if pools is None else pools}, state, 1_700_000_000)
    assert errors == []
    return [(e["event"], e["node"]) for e in events]


@pytest.fixture
def cs() -> ModuleType:
    return spares_module()


def test_a_kept_failure_swaps_one_spare_in_once_and_the_repaired_node_becomes_the_spare(cs: ModuleType):
    slurm = FakeSlurm(["dgx01", "dgx02", "dgx03"])
    state = cs.load_state("/nonexistent/spares.json")
    assert rounds(cs, slurm, state) == [("held", "dgx03")]
    assert slurm.held == {"corectl_spares_batch": ["dgx03"]}
    assert rounds(cs, slurm, state) == []  # the pool is whole: nothing to do

    slurm.drain("dgx02", PASSING_XID)  # a failure that ends by itself: no spare for it
    assert rounds(cs, slurm, state) == []
    slurm.resume("dgx02")

    slurm.drain("dgx01", KEPT_XID)
    assert rounds(cs, slurm, state) == [("swap", "dgx03")]
    assert slurm.held == {}  # the last spare released: the reservation is gone
    assert state["covers"] == {"batch": {"dgx03": "dgx01"}}
    assert state["events"][-1]["message"] == f"dgx03 entered batch for dgx01 ({KEPT_XID})"
    assert rounds(cs, slurm, state) == []  # one failure, one swap, however many rounds

    slurm.resume("dgx01")  # heal or corectl resume, validation passed
    assert rounds(cs, slurm, state) == [("spare", "dgx01")]
    assert slurm.held == {"corectl_spares_batch": ["dgx01"]}
    assert state["covers"] == {"batch": {}}
    assert rounds(cs, slurm, state) == []
    assert [c[0] for c in slurm.calls] == ["hold", "hold", "hold"]


def test_with_repaired_back_the_spare_is_held_again_and_the_repaired_node_serves(cs: ModuleType):
    slurm = FakeSlurm(["dgx01", "dgx02", "dgx03"])
    state = cs.load_state("/nonexistent/spares.json")
    pool = {**POOL, "repaired": "back"}
    rounds(cs, slurm, state, [pool])
    slurm.drain("dgx02", "corectl: needs hardware service (xid)")  # heal gave up: out for good too
    assert rounds(cs, slurm, state, [pool]) == [("swap", "dgx03")]
    slurm.resume("dgx02")
    assert rounds(cs, slurm, state, [pool]) == [("back", "dgx03")]
    assert slurm.held == {"corectl_spares_batch": ["dgx03"]}


def test_a_spare_that_failed_is_not_swapped_in_and_the_shortage_is_said_once(cs: ModuleType):
    slurm = FakeSlurm(["dgx01", "dgx02", "dgx03"])
    state = cs.load_state("/nonexistent/spares.json")
    rounds(cs, slurm, state)
    slurm.drain("dgx03", "corectl validation: dcgm-diag: level 2 failed: PCIe")  # the spare failed validation
    slurm.drain("dgx01", KEPT_XID)
    assert rounds(cs, slurm, state) == [("short", "dgx01")]
    assert rounds(cs, slurm, state) == []
    assert slurm.held == {"corectl_spares_batch": ["dgx03"]}


def test_a_spare_busy_validating_is_taken_after_its_validation_job_is_cancelled(cs: ModuleType):
    slurm = FakeSlurm(["dgx01", "dgx02", "dgx03", "dgx04"])
    state = cs.load_state("/nonexistent/spares.json")
    pool = {**POOL, "nodes": ["dgx03", "dgx04"]}
    assert rounds(cs, slurm, state, [pool]) == [("held", "dgx03"), ("held", "dgx04")]
    slurm.jobs.add("dgx03")
    slurm.drain("dgx01", KEPT_XID)
    assert rounds(cs, slurm, state, [pool]) == [("swap", "dgx04")]  # the idle spare first
    slurm.jobs.add("dgx03")
    slurm.drain("dgx02", KEPT_XID)
    assert rounds(cs, slurm, state, [pool]) == [("swap", "dgx03")]
    assert ("cancel", "corectl_spares_batch", "dgx03") in slurm.calls


def test_a_pool_no_longer_declared_is_released(cs: ModuleType):
    slurm = FakeSlurm(["dgx01", "dgx02", "dgx03"])
    state = cs.load_state("/nonexistent/spares.json")
    rounds(cs, slurm, state)
    assert rounds(cs, slurm, state, []) == [("released", "dgx03")]
    assert slurm.held == {}
    assert "batch" not in state["covers"]


def test_the_state_file_is_written_whole_and_read_back(cs: ModuleType, tmp_path: Path):
    slurm = FakeSlurm(["dgx01", "dgx02", "dgx03"])
    path = str(tmp_path / "lib" / "spares.json")
    state = cs.load_state(path)
    rounds(cs, slurm, state)
    cs.save_state(path, state)
    again = cs.load_state(path)
    assert again["events"][0]["message"] == "dgx03 held as a spare of batch"
    assert cs.status(slurm, {"pools": [POOL]}, again)["pools"] == [
        {"partition": "batch", "reservation": "corectl_spares_batch", "size": 1, "spares": ["dgx03"], "covers": {}}
    ]


class LockProbe(FakeSlurm):
    """A slurmctld that, each time the program reads the reservations, tries the state file's lock as another
    corectl-spares would (CI once read a status between a round's reservation change and its saved covers)."""

    def __init__(self, partition: list[str], lock: Path) -> None:
        super().__init__(partition)
        self.lock = lock
        self.free: list[bool] = []

    def reservations(self) -> dict[str, list[str]]:
        with self.lock.open("a") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.free.append(True)
            except BlockingIOError:
                self.free.append(False)
        return super().reservations()


def test_a_round_and_a_status_hold_the_state_files_lock_until_the_state_is_saved(
    cs: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    state, config = tmp_path / "lib" / "spares.json", tmp_path / "spares.json"
    config.write_text(json.dumps({"pools": [POOL], "state": str(state)}))
    slurm = LockProbe(["dgx01", "dgx02", "dgx03"], tmp_path / "lib" / "spares.json.lock")
    monkeypatch.setattr(cs, "Slurm", lambda: slurm)
    assert cs.main(["--config", str(config)]) == 0
    assert capsys.readouterr().out == "dgx03 held as a spare of batch\n"
    assert cs.main(["--config", str(config), "--status"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["pools"][0]["spares"] == ["dgx03"] and shown["events"][0]["event"] == "held", shown
    assert slurm.free == [False, False]  # another round or status waited each time
    with (tmp_path / "lib" / "spares.json.lock").open("a") as after:
        fcntl.flock(after, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the program is done (else BlockingIOError)


def test_a_kept_health_failure_has_its_own_reason_end_and_persists():
    reason = DrainReason.health("xid", "GPU 1 (0000:1B:00.0) Xid 79: fallen off the bus", kept=True)
    assert str(reason) == KEPT_XID
    parsed = DrainReason.parse(KEPT_XID + " [root@2026-12-02T12:00:01]")
    assert parsed == DrainReason(Source.HEALTH, "xid", "GPU 1 (0000:1B:00.0) Xid 79: fallen off the bus", kept=True)
    assert parsed.persists
    assert not DrainReason.parse(PASSING_XID).persists  # type: ignore[union-attr]
    long = DrainReason.health("xid", "x" * 400, kept=True)
    assert len(str(long)) <= 250 and str(long).endswith(" (kept)")


def test_cluster_yml_pools_reach_the_role(root: Path, tmp_path: Path):
    site = tmp_path / "prod"
    site.mkdir()
    text = (root / "inventories" / "prod" / "cluster.yml").read_text()
    text = text.replace("      default: true\n", "      default: true\n      spares: {count: 2, repaired: back}\n", 1)
    (site / "cluster.yml").write_text(text)
    pools = slurm_vars(load_cluster(site))["spares"]
    assert pools == [
        {"partition": "batch", "reservation": "corectl_spares_batch", "nodes": ["dgx11", "dgx12"], "repaired": "back"}
    ]


def test_the_report_times_each_failure_to_its_spare_and_its_repair_and_the_capacity_over_the_period():
    since = datetime(2026, 12, 1, tzinfo=UTC)
    until = since + timedelta(days=1)
    at = since.timestamp()

    def outage(node: str, start_h: float, end_h: float | None) -> Outage:
        start = since + timedelta(hours=start_h)
        end = until if end_h is None else since + timedelta(hours=end_h)
        return Outage(node, start, end, end_h is None, "xid", KEPT_XID)

    gone = [outage("dgx02", 2, 8), outage("dgx05", 20, None), outage("dgx06", 22, 23)]
    changes = [
        (int(at - 3600), "batch", "held", "dgx03", "", "dgx03 held as a spare of batch"),
        (int(at + 2 * 3600 + 4), "batch", "swap", "dgx03", "dgx02", "dgx03 entered batch for dgx02 (...)"),
        (int(at + 8 * 3600 + 30), "batch", "spare", "dgx02", "dgx03", "dgx02 is back in service and held ..."),
        (int(at + 20 * 3600 + 30), "batch", "swap", "dgx02", "dgx05", "dgx02 entered batch for dgx05 (...)"),
        (int(at + 22 * 3600 + 10), "batch", "short", "dgx06", "dgx06", "dgx06 is out of service (...); no spare"),
    ]
    period = spares_period(gone, changes, computes=6, pool=1, since=since, until=until)
    covered = [(c.node, c.spare, c.to_cover, c.to_repair) for c in period.covers]
    assert covered == [
        ("dgx02", "dgx03", timedelta(seconds=4), timedelta(hours=6)),
        ("dgx05", "dgx02", timedelta(seconds=30), None),  # still out at the period's end
        ("dgx06", None, None, timedelta(hours=1)),  # no spare was left for it
    ]
    assert [(c.at - since, c.in_service, c.spares_in_use) for c in period.capacity] == [
        (timedelta(0), 5, 0),
        (timedelta(hours=2), 4, 0),
        (timedelta(hours=2, seconds=4), 5, 1),
        (timedelta(hours=8), 6, 1),  # repaired, not yet held: one node more than declared for 30 s
        (timedelta(hours=8, seconds=30), 5, 0),
        (timedelta(hours=20), 4, 0),
        (timedelta(hours=20, seconds=30), 5, 1),
        (timedelta(hours=22), 4, 1),
        (timedelta(hours=23), 5, 1),
    ]
    # short: 4 s and 30 s of one node, then dgx06's hour
    assert period.short_node_hours == pytest.approx((4 + 30) / 3600 + 1)
    assert (period.lowest.in_service, period.most_in_use) == (4, 1)
    shown = period.as_json()
    assert shown["covers"][0] == {
        "node": "dgx02", "failed": "2026-12-01T02:00:00Z", "spare": "dgx03", "covered": "2026-12-01T02:00:04Z",
        "cover_s": 4.0, "repaired": "2026-12-01T08:00:00Z", "repair_s": 21600.0,
    }  # fmt: skip
    line = capacity_line(period, lambda when: when.strftime("%H:%M:%S"))
    assert line == (
        "capacity: 5 of 5 declared nodes in service at the end; lowest 4 (02:00:00); spares in use at most 1 of 1;"
        " 1.01 node-hours short"
    )


def test_the_spare_reservations_are_read_from_scontrol():
    """The line as Slurm 22.05 printed it on the lab (its head, 2026-12-02), and one of another reservation."""
    held = (
        "ReservationName=corectl_spares_batch StartTime=2026-12-02T13:11:42 EndTime=2027-12-02T13:11:42 "
        "Duration=365-00:00:00 Nodes=dgx[03-04] NodeCnt=2 CoreCnt=4 Features=(null) PartitionName=(null) "
        "Flags=IGNORE_JOBS,SPEC_NODES TRES=cpu=4 Users=root Groups=(null) Accounts=(null) Licenses=(null) "
        "State=ACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)"
    )
    other = held.replace("corectl_spares_batch", "maint_rack4").replace("Nodes=dgx[03-04]", "Nodes=dgx07")
    assert spare_reservations([held, other, "No reservations in the system"]) == {"corectl_spares_batch": "dgx[03-04]"}
