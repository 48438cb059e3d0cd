"""corectl runs: past runs from the records each run leaves."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from corectl.ansible.events import HostStats, RunRequest, RunResult
from corectl.ansible.records import expected_from_history, load_runs, record
from corectl.commands.runs import resolve_run, runs_table, show_run
from corectl.errors import CorectlError
from corectl.site import Site


def test_runs_are_listed_oldest_first_and_broken_records_skipped(tmp_path: Path, root: Path):
    site = Site(root=root, directory=tmp_path / "site")
    for ident, started, status, hosts in [
        ("b", "2026-11-21T10:05:00+00:00", "failed", {"dgx01": {"failed": 1}, "head01": {"changed": 0}}),
        ("a", "2026-11-21T10:00:00+00:00", "successful", {"dgx01": {"changed": 3}}),
    ]:
        (site.runs_dir / ident).mkdir(parents=True)
        record = {"command": "provision", "started": started, "status": status, "hosts": hosts, "elapsed_s": 1.0}
        (site.runs_dir / ident / "corectl.json").write_text(json.dumps(record))
    (site.runs_dir / "c").mkdir()
    (site.runs_dir / "c" / "corectl.json").write_text("{truncated")
    records = load_runs(site)
    assert [r["id"] for r in records] == ["a", "b"]
    console = Console(width=200, record=True)
    console.print(runs_table(site, 10))
    text = console.export_text()
    assert "2026-11-21 10:00:00" in text and "1: dgx01" in text
    assert text.index("│ successful") < text.index("│ failed")


# --------------------------------------------------------------------------- runs --show ID

LAST_NIGHT = "20261123T051500Z-12345"


def _event(counter: int, kind: str, play: str, task: str = "", host: str = "", **data: Any) -> dict[str, Any]:
    return {
        "counter": counter,
        "event": kind,
        "stdout": "",
        "event_data": {"play": play, "task": task, **({"host": host} if host else {}), **data},
    }


def _fake_run(site: Site, ident: str, events: list[dict[str, Any]], **record: Any) -> Path:
    """A run directory as ansible-runner and records.record() leave it."""
    run = site.runs_dir / ident
    (run / "job_events").mkdir(parents=True)
    for event in events:
        name = f"{event['counter']}-{uuid.uuid4()}.json"
        (run / "job_events" / name).write_text(json.dumps(event))
    base = {"command": "provision", "playbook": "site.yml", "limit": None, "tags": None, "check": False,
            "started": "2026-11-23T05:15:00+00:00", "elapsed_s": 754.2, "status": "failed", "rc": 2}  # fmt: skip
    (run / "corectl.json").write_text(json.dumps({**base, **record}))
    return run


def _text(renderable: Any) -> str:
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(renderable)
    return console.export_text()


BASE, COMPUTE = "Base OS settings on every node", "Slurm compute nodes"
SSH_SAYS = "ssh: connect to host dgx03\r\n@@@@@@@@\nHost key verification failed."  # the reason comes last
SYSTEMD_SAYS = "Unable to start service slurmd\nJob failed"  # the reason comes first
EVENTS = [
    _event(1, "playbook_on_start", ""),
    _event(2, "playbook_on_play_start", BASE, name=BASE),
    _event(3, "playbook_on_task_start", BASE, "Set the time zone"),
    _event(4, "runner_on_start", BASE, "Set the time zone", "dgx01"),
    _event(5, "runner_on_ok", BASE, "Set the time zone", "dgx01", res={"changed": True}),
    _event(6, "runner_on_ok", BASE, "Set the time zone", "dgx02", res={"changed": False}),
    _event(7, "runner_on_ok", BASE, "Set the time zone", "head01", res={"changed": False}),
    _event(8, "runner_on_skipped", BASE, "Install base packages", "dgx01", res={}),
    _event(9, "runner_on_skipped", BASE, "Install base packages", "head01", res={}),
    _event(10, "runner_on_unreachable", BASE, "Install base packages", "dgx03", res={"msg": SSH_SAYS}),
    _event(11, "playbook_on_play_start", "Slurm login nodes", name="Slurm login nodes"),
    _event(12, "playbook_on_no_hosts_matched", "Slurm login nodes"),
    _event(13, "playbook_on_play_start", COMPUTE, name=COMPUTE),
    _event(14, "runner_on_failed", COMPUTE, "Probe the GPUs", "dgx01", ignore_errors=True, res={"msg": "no GPU"}),
    _event(
        15,
        "runner_on_ok",
        COMPUTE,
        "Write slurmd's files",
        "dgx01",
        res={"changed": True, "changed_paths": ["/etc/default/slurmd", "/usr/local/sbin/corectl-slurm-prolog"]},
    ),
    _event(16, "runner_on_failed", COMPUTE, "Start slurmd", "dgx02", res={"msg": SYSTEMD_SAYS}),
    _event(17, "playbook_on_stats", ""),
]


def test_show_run_lists_what_changed_and_failed_per_host(tmp_path: Path, root: Path):
    site = Site(root=root, directory=tmp_path / "site")
    run = _fake_run(site, LAST_NIGHT, EVENTS, limit="dgx01", check=False)
    # ansible-runner's incomplete copy of event 15: read, it would list the change twice
    (run / "job_events" / f"15-{uuid.uuid4()}-partial.json").write_text(json.dumps(EVENTS[14]))
    text = _text(show_run(site, LAST_NIGHT))
    lines = text.splitlines()
    assert (
        lines[0] == f"run {LAST_NIGHT}: provision --limit dgx01 (site.yml), failed, 754.2s, started 2026-11-23 05:15:00"
    )
    assert lines[1:] == [
        "dgx01",
        f"  changed: {BASE} / Set the time zone",
        f"  changed: {COMPUTE} / Write slurmd's files: /etc/default/slurmd, /usr/local/sbin/corectl-slurm-prolog",
        "  not listed: 1 skipped, 1 ignored",
        "dgx02",
        f"  failed: {COMPUTE} / Start slurmd: Unable to start service slurmd",
        "  not listed: 1 ok",
        "dgx03",
        f"  unreachable: {BASE} / Install base packages: Host key verification failed.",
        "  not listed: no task results",
        "no changes on head01: 1 ok, 1 skipped",
    ]


def test_show_run_of_a_run_that_changed_nothing_says_so_in_one_line(tmp_path: Path, root: Path):
    site = Site(root=root, directory=tmp_path / "site")
    quiet = [e for e in EVENTS if e["event"] in ("runner_on_skipped", "playbook_on_play_start")]
    quiet.append(_event(20, "runner_on_ok", BASE, "Set the time zone", "dgx01", res={"changed": False}))
    _fake_run(site, LAST_NIGHT, quiet, status="successful")
    lines = _text(show_run(site, "last")).splitlines()
    assert lines[1:] == ["no changes on 2 hosts (1 ok, 2 skipped)"]
    assert ", successful," in lines[0]


def test_a_fanned_out_runs_shards_and_their_hosts_are_shown(tmp_path: Path, root: Path):
    """corectl.ansible.remote.fanout keeps each shard's events under shards/<shard>/ and lists the shards."""
    site = Site(root=root, directory=tmp_path / "site")
    shards = [
        {"name": "services", "runner": "r1", "hosts": ["head01"], "status": "successful", "error": ""},
        {"name": "rack-r1", "runner": "r1", "hosts": ["dgx01", "dgx02"], "status": "successful", "error": ""},
        {"name": "rack-r2", "runner": "r2", "hosts": ["dgx03"], "status": "error", "error": "Connection refused"},
    ]
    run = _fake_run(site, LAST_NIGHT, [], shards=shards)
    for shard, events in [("services", EVENTS[6:7]), ("rack-r1", [EVENTS[4], EVENTS[14]])]:
        where = run / "shards" / shard / "artifacts" / "job_events"
        where.mkdir(parents=True)
        for event in events:
            (where / f"{event['counter']}-{uuid.uuid4()}.json").write_text(json.dumps(event))
    lines = _text(show_run(site, "last")).splitlines()
    assert lines[1:] == [
        "  shard services on runner r1: successful, head01",
        "  shard rack-r1 on runner r1: successful, dgx[01-02]",
        "  shard rack-r2 on runner r2: error, dgx03 (Connection refused)",
        "dgx01",
        f"  changed: {BASE} / Set the time zone",
        f"  changed: {COMPUTE} / Write slurmd's files: /etc/default/slurmd, /usr/local/sbin/corectl-slurm-prolog",
        "  not listed: no task results",
        "no changes on head01: 1 ok",
    ]
    assert "failed (3 shards, 1 broke off)" in _text(runs_table(site, 5))


def test_show_run_finds_a_run_by_prefix_or_last_and_names_near_ones_otherwise(tmp_path: Path, root: Path):
    site = Site(root=root, directory=tmp_path / "site")
    ids = ["20261121T220000Z-100", "20261122T220000Z-200", "20261122T230000Z-300", LAST_NIGHT]
    for ident in ids:
        _fake_run(site, ident, EVENTS[:2], command=f"run {ident[-3:]}")
    assert resolve_run(site, "last") == LAST_NIGHT
    assert resolve_run(site, "20261121") == ids[0]
    assert resolve_run(site, ids[1]) == ids[1]
    assert "run 100 (site.yml)" in _text(show_run(site, "20261121T"))
    with pytest.raises(CorectlError) as ambiguous:
        show_run(site, "20261122T")
    assert ambiguous.value.exit_code == 2
    assert str(ambiguous.value) == f"run '20261122T' is ambiguous: {ids[1]}, {ids[2]}"
    with pytest.raises(CorectlError) as unknown:
        show_run(site, "20261122T2330")
    message = str(unknown.value)
    assert unknown.value.exit_code == 2 and "\n" not in message
    assert message.startswith("no run '20261122T2330' in ") and message.endswith(
        f"nearest: {ids[2]}, {ids[1]}, {ids[3]}"
    )


def test_show_run_without_runs(tmp_path: Path, root: Path):
    site = Site(root=root, directory=tmp_path / "site")
    with pytest.raises(CorectlError, match="no runs kept") as error:
        show_run(site, "last")
    assert error.value.exit_code == 2


# --------------------------------------------------------------------------- the expected total of a run


def test_a_runs_task_count_is_recorded_and_becomes_the_next_runs_expected_total(tmp_path: Path, root: Path):
    site = Site(root=root, directory=tmp_path / "site")

    def finished(ident: str, status: str, tasks: int, elapsed: float, **options: Any) -> None:
        request = RunRequest(site=site, **{"command": "provision", **options})
        hosts = {"dgx01": HostStats(ok=tasks)}
        run = RunResult(status, 0 if status == "successful" else 2, hosts, site.runs_dir / ident, elapsed, {}, tasks)
        record(request, run, f"2026-11-2{ident}T05:00:00+00:00")

    assert expected_from_history(site, "provision", "site.yml") is None
    finished("1", "successful", 224, 600.0)
    finished("2", "successful", 12, 30.0, tags="slurm")  # another set of tasks
    finished("3", "successful", 5, 10.0, playbook="health.yml")
    finished("4", "failed", 100, 90.0)  # stopped early: not a total
    finished("5", "successful", 30, 40.0, command="drain dgx01")
    assert json.loads((site.runs_dir / "1" / "corectl.json").read_text())["tasks"] == 224
    assert expected_from_history(site, "provision", "site.yml") == (224, 600.0)
    assert expected_from_history(site, "provision", "site.yml", tags="slurm") == (12, 30.0)
    assert expected_from_history(site, "provision", "site.yml", check=True) is None


def test_a_run_of_site_yml_says_whether_the_site_has_run_before(tmp_path: Path, root: Path):
    """Role slurm keeps slurmctld stopped on an empty state directory once a provision of the site succeeded
    (a replaced head): corectl passes corectl_site_has_run to every run of site.yml, from its run records."""
    from corectl.ansible.runner import selection

    site = Site(root=root, directory=tmp_path / "site")
    provision = RunRequest(site=site, playbook="site.yml", command="provision")
    nothing = {"corectl_site_has_run": False, "corectl_accounting_has_run": False}
    assert selection(provision, {})["extravars"] == nothing
    for ident, playbook, status, check in [
        ("a", "site.yml", "failed", False),
        ("b", "site.yml", "successful", True),  # a plan changes nothing: it is not a run of the site
        ("c", "health.yml", "successful", False),
    ]:
        (site.runs_dir / ident).mkdir(parents=True)
        kept = {"command": "x", "playbook": playbook, "status": status, "check": check, "started": ident}
        (site.runs_dir / ident / "corectl.json").write_text(json.dumps(kept))
    assert selection(provision, {})["extravars"] == nothing
    (site.runs_dir / "d").mkdir()
    done = {"command": "provision", "playbook": "site.yml", "status": "successful", "check": False, "started": "d"}
    (site.runs_dir / "d" / "corectl.json").write_text(json.dumps(done))
    assert selection(provision, {"x": 1})["extravars"] == {
        "x": 1,
        "corectl_site_has_run": True,
        "corectl_accounting_has_run": False,
    }
    # other playbooks are not told
    health = RunRequest(site=site, playbook="health.yml", command="health")
    assert "extravars" not in selection(health, {})


def test_the_accounting_has_run_once_a_run_of_the_site_converged_on_its_database_host(tmp_path: Path, root: Path):
    """Issue 48: role slurm keeps a replaced head's slurmdbd stopped on an empty database once the site's accounting
    has run; a site that only now declares accounting (or whose runs never reached the database's host) must start
    it. The mark is set by a converged run of site.yml that included the host site.json names as dbd_host."""
    from corectl.ansible.runner import selection

    site = Site(root=root, directory=tmp_path / "site")
    site.directory.mkdir(parents=True)
    provision = RunRequest(site=site, playbook="site.yml", command="provision")

    def finished(ident: str, hosts: list[str], playbook: str = "site.yml", status: str = "successful") -> bool:
        request = RunRequest(site=site, playbook=playbook, command="provision")
        run = RunResult(status, 0, {h: HostStats(ok=1) for h in hosts}, site.runs_dir / ident, 1.0, {}, 1)
        (site.runs_dir / ident).mkdir(parents=True)
        record(request, run, "2026-12-02T16:00:00+00:00")
        return bool(selection(provision, {})["extravars"]["corectl_accounting_has_run"])

    assert finished("1", ["head01", "dgx01"]) is False  # no site.json: no accounting declared
    site.site_file.write_text(json.dumps({"corectl_slurm": {"dbd_host": ""}}))
    assert finished("2", ["head01", "dgx01"]) is False  # accounting off
    site.site_file.write_text(json.dumps({"corectl_slurm": {"dbd_host": "head01"}}))
    assert finished("3", ["dgx01"]) is False  # limited to other hosts
    assert finished("4", ["head01"], status="failed") is False
    assert finished("5", ["head01"], playbook="health.yml") is False
    assert finished("6", ["head01", "dgx01"]) is True
    site.site_file.write_text(json.dumps({"corectl_slurm": {"dbd_host": ""}}))
    assert finished("7", ["head01"]) is True  # the mark stays


def test_the_site_has_run_before_after_its_provisions_records_are_pruned(tmp_path: Path, root: Path):
    """The site keeps only its newest runs: health checks, heals and power commands soon push a provision's record
    out. That the site has run before must outlive it, or a replaced head would start slurmctld on an empty
    state directory and lose the queue (the lab's second e2e lab found it: its heal test's runs pruned the record
    of the only provision before the head was replaced)."""
    from corectl import store
    from corectl.ansible.records import KEEP_RUNS, prune_runs, site_has_run

    site = Site(root=root, directory=tmp_path / "site")

    def finished(second: int, playbook: str, status: str = "successful", *, check: bool = False) -> Path:
        ident = f"20261127T05{second // 60:02d}{second % 60:02d}Z-{100 + second}"
        request = RunRequest(site=site, playbook=playbook, command="x", check=check)
        run = RunResult(status, 0, {"dgx01": HostStats(ok=1)}, site.runs_dir / ident, 1.0, {}, 1)
        record(request, run, f"2026-11-27T05:00:{second % 60:02d}+00:00")
        return site.runs_dir / ident

    finished(0, "site.yml", "failed")
    finished(1, "site.yml", check=True)  # a plan
    assert not site_has_run(site) and store.marked(site, store.HAS_RUN) is None
    provision = finished(2, "site.yml")
    assert site_has_run(site)
    for second in range(3, 3 + KEEP_RUNS):
        finished(second, "health.yml")
    assert provision in prune_runs(site)
    assert not any(r["playbook"] == "site.yml" and r["status"] == "successful" for r in load_runs(site))
    assert provision.name not in {r["id"] for r in load_runs(site)}  # the index holds the kept runs
    assert site_has_run(site)
    assert store.marked(site, store.HAS_RUN) == ("2026-11-27T05:00:02Z", provision.name)


def test_lab_down_forgets_that_the_site_has_run(tmp_path: Path, root: Path):
    """`corectl lab down` removes the machines; a later `lab up` is a new cluster. Its first provision must start
    slurmctld and slurmdbd on their empty state, not hold them as for a replaced head: the runs, the facts and the
    store's marks go with the machines (a manual lab brought up again on its old site held slurmctld, session 44)."""
    from corectl import store
    from corectl.ansible.records import accounting_has_run, site_has_run
    from corectl.lab.nodes import forget_machines

    site = Site(root=root, directory=tmp_path / "site")
    site.directory.mkdir(parents=True)
    site.site_file.write_text(json.dumps({"corectl_slurm": {"dbd_host": "head01"}}))
    request = RunRequest(site=site, playbook="site.yml", command="provision")
    ident = "20261203T140000Z-100"
    run = RunResult("successful", 0, {"head01": HostStats(ok=1)}, site.runs_dir / ident, 1.0, {}, 1)
    (site.runs_dir / ident).mkdir(parents=True)
    record(request, run, "2026-12-03T14:00:00+00:00")
    site.facts_dir.mkdir(parents=True)
    assert site_has_run(site) and accounting_has_run(site)

    forget_machines(site)
    assert not site_has_run(site) and not accounting_has_run(site)
    assert store.marked(site, store.HAS_RUN) is None
    assert not site.runs_dir.exists() and not site.facts_dir.exists()
    assert sorted(p.name for p in site.directory.iterdir() if not p.name.startswith(".history")) == ["site.json"]
    forget_machines(site)  # twice: nothing left to remove is no error
