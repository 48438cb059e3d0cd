"""corectl power and corectl heal without nodes: cluster.yml's bmc, the vaulted BMC login, the
job guard, the off-then-on cycle, and heal's ladder walk against a simulated cluster (Slurm state,
health checks and steps replaced at their boundaries; the lab end-to-end test runs them for real)."""

from __future__ import annotations

import io
import textwrap
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from rich.console import Console

from conftest import ROOT
from corectl import power as power_cmd
from corectl.ansible.events import RunResult
from corectl.commands import heal as heal_cmd
from corectl.commands import power as power_command
from corectl.drain_reason import source_of
from corectl.errors import CorectlError, ValidationFailed
from corectl.health import failures
from corectl.health import heal as rules
from corectl.health.report import HealthResult
from corectl.node_state import NodeState
from corectl.secrets import bmc_credentials, set_bmc_credentials
from corectl.site import Site
from corectl.site.context import Context
from corectl.site.loader import load_cluster
from corectl.slurm import SlurmStatus


@pytest.fixture
def site(prod_copy: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    monkeypatch.setenv("CORECTL_VAULT_PASSWORD", "unit-test-vault-password")
    return Site(root=ROOT, directory=prod_copy)


def edit_nodes(site: Site, old: str, new: str) -> None:
    text = site.cluster_file.read_text()
    assert old in text
    site.cluster_file.write_text(text.replace(old, new))


# --------------------------------------------------------------------------- cluster.yml and the vault


def test_a_bmc_range_counts_up_with_the_nodes_and_gets_its_protocols_port(site: Site) -> None:
    cluster = load_cluster(site.directory)
    bmcs = {n.name: n.bmc for n in cluster.nodes if n.bmc}
    assert sorted(bmcs) == [f"dgx{i:02d}" for i in range(1, 13)]
    assert bmcs["dgx01"].address == "10.10.9.11" and bmcs["dgx06"].address == "10.10.9.16"
    assert bmcs["dgx07"].address == "10.10.9.17" and bmcs["dgx12"].address == "10.10.9.22"
    assert {(b.protocol, b.port, b.scheme) for b in bmcs.values()} == {("redfish", 443, "https")}
    assert cluster.node("head01").bmc is None


def test_ipmi_defaults_to_port_623(site: Site) -> None:
    edit_nodes(site, "bmc: {address: 10.10.9.17, protocol: redfish}", "bmc: {address: 10.10.9.17, protocol: ipmi}")
    assert load_cluster(site.directory).node("dgx07").bmc.port == 623


@pytest.mark.parametrize(
    ("new", "field", "message"),
    [
        ("bmc: {address: 10.10.9.12, protocol: redfish}", "nodes[2].bmc.address", "duplicate BMC address"),
        ("bmc: {address: '10.10.9.[17-18]', protocol: redfish}", "nodes[2].bmc.address", "gives 2 addresses for 6"),
        ("bmc: {address: 10.10.9.17, protocol: smash}", "nodes[2].bmc.protocol", "redfish"),
        ("bmc: {address: 10.10.9.17, port: 70000}", "nodes[2].bmc.port", "65535"),
        ("bmc: {address: 10.10.9.17, user: root}", "nodes[2].bmc.user", "unknown key (allowed: address, protocol"),
    ],
)
def test_a_wrong_bmc_is_one_error_naming_its_field(site: Site, new: str, field: str, message: str) -> None:
    edit_nodes(site, "bmc: {address: 10.10.9.17, protocol: redfish}", new)
    with pytest.raises(ValidationFailed) as failed:
        load_cluster(site.directory)
    text = str(failed.value)
    assert field in text and message in text, text


def test_bmc_credentials_live_encrypted_in_the_vault(site: Site) -> None:
    with pytest.raises(CorectlError, match="corectl secrets set-bmc"):
        bmc_credentials(site)
    set_bmc_credentials(site, "admin", "s3cret-bmc-Password")
    assert bmc_credentials(site) == ("admin", "s3cret-bmc-Password")
    stored = (site.directory / "secrets" / "secrets.yml").read_bytes()
    assert stored.startswith(b"$ANSIBLE_VAULT") and b"s3cret-bmc-Password" not in stored
    with pytest.raises(CorectlError, match="BMC user"):
        set_bmc_credentials(site, "ad min", "x")


# --------------------------------------------------------------------------- corectl power


@dataclass
class FakeBmc:
    """A BMC whose node changes state when told; records what it was told."""

    powered: str = "on"
    told: list[str] = field(default_factory=list)
    broken: bool = False

    def state(self) -> str:
        return self.powered

    def act(self, action: str) -> None:
        if self.broken:
            from corectl.bmc import BmcError

            raise BmcError("dgx01: BMC 10.10.9.11:443 (redfish): unreachable (ConnectTimeout)")
        self.told.append(action)
        self.powered = "on" if action == "on" else "off"


@pytest.fixture
def fake_bmcs(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeBmc]:
    bmcs: dict[str, FakeBmc] = {}
    monkeypatch.setattr(power_cmd.bmc, "client", lambda node, *_: bmcs.setdefault(node, FakeBmc()))
    return bmcs


def test_power_cycle_is_off_seen_off_then_on_and_is_recorded(site: Site, fake_bmcs: dict[str, FakeBmc]) -> None:
    cluster = load_cluster(site.directory)
    record = power_cmd.history_recorder(site, warn=pytest.fail)
    nodes = power_cmd.bmc_nodes(cluster, "dgx[01-02]")
    results = power_cmd.apply(site, nodes, "cycle", power_cmd.bmc.Credentials("a", "b"), 5, record)
    assert [(r.node, r.ok, r.state) for r in results] == [("dgx01", True, "on"), ("dgx02", True, "on")]
    assert fake_bmcs["dgx01"].told == ["off", "on"]
    history = failures.node_history(site, "dgx02")
    assert [(e.action, e.outcome) for e in history] == [("power cycle", "ok")]


def test_a_bmc_that_fails_fails_only_its_node(site: Site, fake_bmcs: dict[str, FakeBmc]) -> None:
    fake_bmcs["dgx01"] = FakeBmc(broken=True)
    nodes = power_cmd.bmc_nodes(load_cluster(site.directory), "dgx[01-02]")
    results = power_cmd.apply(site, nodes, "off", power_cmd.bmc.Credentials("a", "b"), 5)
    assert [(r.node, r.ok) for r in results] == [("dgx01", False), ("dgx02", True)]
    assert "unreachable" in results[0].detail and not results[0].detail.startswith("dgx01:")


def test_power_names_nodes_without_a_bmc_and_unknown_ones(site: Site) -> None:
    cluster = load_cluster(site.directory)
    with pytest.raises(CorectlError, match="no bmc declared for head01"):
        power_cmd.bmc_nodes(cluster, "head01")
    with pytest.raises(CorectlError, match="not nodes of this site: dgx99"):
        power_cmd.bmc_nodes(cluster, "dgx[12,99]")


def test_power_off_refuses_a_node_with_jobs_or_a_head_node(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    status = SlurmStatus(states={"dgx01": NodeState("alloc")}, jobs={"4711": ["dgx01"]})
    monkeypatch.setattr(power_cmd, "read_slurm_status", lambda _ctx: status)
    cluster = load_cluster(site.directory)
    nodes = [cluster.node("dgx01"), cluster.node("dgx02"), cluster.node("head01")]
    reasons = power_cmd.refusals(Context(site, writes=False), nodes)
    assert reasons == ["head01 is slurm_controller, slurm_dbd, login, monitoring", "dgx01 runs job 4711"]
    edit_nodes(site, "rack: r01\n  - name: dgx", "rack: r01\n    bmc: {address: 10.10.9.10}\n  - name: dgx")
    with pytest.raises(CorectlError, match=r"power off refused: dgx01 runs job 4711; drain first, or use --force"):
        power_command.power(Context(site), "off", "dgx01", force=False, timeout=5, warn=pytest.fail)


# --------------------------------------------------------------------------- heal's rules


def test_only_health_check_drains_name_a_check() -> None:
    assert rules.drained_check("corectl-health: xid: Xid 79 on GPU 3") == "xid"
    assert rules.drained_check("corectl-health: fabricmanager: nv-fabricmanager is not running") == "fabricmanager"
    assert rules.drained_check("corectl upgrade drivers 550.90.07") is None
    assert rules.drained_check("corectl: needs hardware service (xid)") is None
    assert rules.drained_check("bad cable, ticket 1234") is None


def test_ladders_from_group_vars_are_checked() -> None:
    assert rules.ladders({rules.LADDERS_VAR: {"xid": ["reboot", "power-cycle"]}}) == {"xid": ("reboot", "power-cycle")}
    with pytest.raises(CorectlError, match="unknown step 'reflash'"):
        rules.ladders({rules.LADDERS_VAR: {"xid": ["reboot", "reflash"]}})
    with pytest.raises(CorectlError, match="must be a list of steps"):
        rules.ladders({rules.LADDERS_VAR: {"xid": "reboot"}})


def test_the_shipped_ladders_use_known_steps_and_checks() -> None:
    import yaml

    from corectl.health.report import CHECK_ORDER

    values = yaml.safe_load((ROOT / "group_vars" / "all" / "heal.yml").read_text())
    ladders = rules.ladders(values)
    assert set(ladders) <= set(CHECK_ORDER), set(ladders) - set(CHECK_ORDER)
    assert ladders["xid"][-1] == "power-cycle"


# --------------------------------------------------------------------------- heal against a simulated cluster


class SimulatedCluster:
    """Slurm's view and each node's faults; steps fix the faults they fix, as on real nodes."""

    FIXES: ClassVar[dict[str, set[str]]] = {
        "restart-fabricmanager": {"fabricmanager"},
        "reboot": {"xid"},
        "power-cycle": {"xid", "gpu-count"},
    }

    def __init__(self, drained: dict[str, str], jobs: dict[str, list[str]] | None = None) -> None:
        self.reasons = dict(drained)
        self.faults = {node: rules.drained_check(reason) for node, reason in drained.items()}
        self.stubborn: set[str] = set()  # nodes no step fixes
        self.jobs = jobs or {}
        self.steps: list[tuple[str, tuple[str, ...]]] = []
        self.evidence: list[tuple[str, ...]] = []  # nodes whose evidence was kept, run by run
        self.health_runs: list[tuple[str, ...]] = []
        self.validation_runs: list[tuple[tuple[str, ...], int | None]] = []  # (nodes, dcgmi diag level)

    def status(self, *_: Any) -> SlurmStatus:
        states = {n: NodeState("drain", r) for n, r in self.reasons.items()}
        return SlurmStatus(states=states, jobs={job: [n] for n, jobs in self.jobs.items() for job in jobs})

    def health(
        self, _site: Site, _console: Console, *, limit: str, level: int | None = None, validation: bool = False
    ) -> HealthResult:
        nodes = tuple(limit.split(","))
        self.health_runs.append(nodes)
        if validation:
            self.validation_runs.append((nodes, level))
        reports = {}
        for node in nodes:
            fault = self.faults.get(node)
            checks = [{"name": fault, "status": "fail", "message": "simulated"}] if fault else []
            reports[node] = {"node": node, "ok": not fault, "checks": [*checks, {"name": "clock", "status": "pass"}]}
        return HealthResult(reports)

    def step(self, step: str, nodes: list[str], **extravars: str) -> dict[str, str]:
        if step == "evidence":  # what playbooks/heal.yml's evidence step leaves on the control host
            self.evidence.append(tuple(nodes))
            for node in nodes:
                kept = Path(extravars["corectl_heal_evidence_dir"]) / node
                kept.mkdir(parents=True, exist_ok=True)
                (kept / "kernel.log").write_text(f"NVRM: Xid (PCI:0000:18:00): 79, {node}\n")
            return {}
        self.steps.append((step, tuple(nodes)))
        for node in nodes:
            if node not in self.stubborn and self.faults.get(node) in self.FIXES.get(step, ()):
                self.faults[node] = None
        return {}

    def state_run(self, _ctx, _console, names, state, reason=None, only_source=None) -> RunResult:
        for node in names:
            if state == "resume" and (only_source is None or source_of(self.reasons[node]) == only_source):
                self.reasons[node] = "none"
            elif state == "drain":
                self.reasons[node] = reason
        return RunResult(status="successful", rc=0, hosts={}, artifact_dir=Path("/nonexistent"), elapsed=0.0)


@pytest.fixture
def simulate(site: Site, monkeypatch: pytest.MonkeyPatch):
    def make(drained: dict[str, str], jobs: dict[str, list[str]] | None = None) -> SimulatedCluster:
        sim = SimulatedCluster(drained, jobs)
        monkeypatch.setattr(heal_cmd, "read_slurm_status", sim.status)
        monkeypatch.setattr(heal_cmd, "health", sim.health)
        monkeypatch.setattr(heal_cmd, "state_run", sim.state_run)
        monkeypatch.setattr(
            heal_cmd.Healer, "playbook_step", lambda _self, step, nodes, **extravars: sim.step(step, nodes, **extravars)
        )
        monkeypatch.setattr(heal_cmd.Healer, "power_cycle", lambda _self, nodes: sim.step("power-cycle", nodes))
        return sim

    return make


def run_heal(site: Site, named: str | None = None) -> dict[str, heal_cmd.Outcome]:
    console = Console(file=io.StringIO())
    return {o.node: o for o in heal_cmd.heal(Context(site), console, named, warn=pytest.fail)}


def test_heal_walks_each_ladder_checks_after_every_step_and_resumes_what_passes(site: Site, simulate) -> None:
    sim = simulate(
        {
            "dgx01": "corectl-health: fabricmanager: nv-fabricmanager is not running",
            "dgx02": "corectl-health: xid: Xid 79 on GPU 3",
            "dgx03": "corectl-health: gpu-count: 7 of 8 GPUs",
            "dgx04": "replacing a PSU (ops-1234)",
        }
    )
    outcomes = run_heal(site)
    assert sim.steps == [
        ("restart-fabricmanager", ("dgx01",)),
        ("reboot", ("dgx02", "dgx03")),
        ("power-cycle", ("dgx03",)),
    ]
    assert sim.health_runs == [("dgx01", "dgx02", "dgx03"), ("dgx01",), ("dgx02", "dgx03"), ("dgx03",)]
    # after a reboot or power cycle (a hardware-class remedy) the checks run with the validation: dcgmi diag at
    # level 2 (prod's health.validation) and nccl; after a service restart, the checks alone
    assert sim.validation_runs == [(("dgx02", "dgx03"), 2), (("dgx03",), 2)]
    assert {n: o.result for n, o in outcomes.items()} == {"dgx01": "resumed", "dgx02": "resumed", "dgx03": "resumed"}
    assert outcomes["dgx01"].detail == "fabricmanager: the checks pass after restart-fabricmanager"
    assert (
        outcomes["dgx03"].detail
        == "gpu-count: the checks and validation (dcgmi diag -r 2, nccl) pass after power-cycle"
    )
    assert sim.reasons == {"dgx01": "none", "dgx02": "none", "dgx03": "none", "dgx04": "replacing a PSU (ops-1234)"}
    actions = [(e.action, e.outcome) for e in reversed(failures.node_history(site, "dgx03"))]
    assert actions == [
        ("heal: evidence", "ok"),  # kept before the reboot ...
        ("heal: reboot", "ok"),
        ("heal: evidence", "ok"),  # ... and before the power cycle; a restart erases nothing
        ("heal: power-cycle", "ok"),
        ("heal: resumed", "ok"),
    ]
    assert sim.evidence == [("dgx02", "dgx03"), ("dgx03",)]
    kept = [e for e in failures.node_history(site, "dgx03") if getattr(e, "action", "") == "heal: evidence"][-1]
    assert kept.detail.startswith(f"before reboot: {site.evidence_dir}/") and kept.detail.endswith(
        "/dgx03 (kernel.log)"
    )


def test_a_node_the_ladder_cannot_fix_is_drained_for_hardware_service(site: Site, simulate) -> None:
    sim = simulate({"dgx05": "corectl-health: xid: Xid 79 on GPU 3"})
    sim.stubborn.add("dgx05")
    outcome = run_heal(site)["dgx05"]
    assert (outcome.result, outcome.detail) == ("needs service", "xid: still failing (xid) after reboot, power-cycle")
    assert sim.reasons["dgx05"] == "corectl: needs hardware service (xid)"
    # nothing heals it again: the reason is no longer the health checks'
    sim.steps.clear()
    assert run_heal(site) == {} and sim.steps == []


def test_the_window_counts_hours_and_zero_turns_it_off() -> None:
    now = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
    healed = failures.Action("dgx01", failures.stamp(now - timedelta(hours=5)), rules.HEALED, rules.OK)
    assert rules.healed_recently(healed, now, 6) and not rules.healed_recently(healed, now, 4)
    assert not rules.healed_recently(healed, now, 0) and not rules.healed_recently(None, now, 24)
    assert rules.window_hours({rules.WINDOW_VAR: 0}) == 0 and rules.window_hours({}) == 24
    with pytest.raises(CorectlError, match="corectl_heal_window_hours must be a whole number >= 0"):
        rules.window_hours({rules.WINDOW_VAR: "soon"})


def test_a_node_failing_again_soon_after_being_healed_goes_straight_to_service(site: Site, simulate) -> None:
    recent = datetime.now(UTC) - timedelta(hours=3)
    failures.record_action(site, "dgx06", rules.HEALED, rules.OK, "xid: the checks pass after reboot", recent)
    sim = simulate({"dgx06": "corectl-health: xid: Xid 79 on GPU 3"})
    outcome = run_heal(site)["dgx06"]
    assert outcome.result == "needs service" and "within 24h of being healed" in outcome.detail
    assert sim.steps == []


def test_the_window_is_per_check_another_failure_walks_its_ladder(site: Site, simulate) -> None:
    recent = datetime.now(UTC) - timedelta(hours=1)
    failures.record_action(site, "dgx06", rules.HEALED, rules.OK, "xid: the checks pass after reboot", recent)
    failures.record_action(site, "dgx06", rules.HEALED, rules.OK, "the checks pass again", recent)
    sim = simulate({"dgx06": "corectl-health: fabricmanager: nv-fabricmanager is not running"})
    assert run_heal(site)["dgx06"].result == "resumed"
    assert sim.steps == [("restart-fabricmanager", ("dgx06",))]


def test_heal_leaves_busy_nodes_operator_drains_and_checks_without_a_ladder(site: Site, simulate) -> None:
    sim = simulate(
        {
            "dgx07": "corectl-health: xid: Xid 79 on GPU 3",
            "dgx08": "corectl-health: temperature: GPU 2 at 95 C",
            "dgx09": "RMA ticket 42",
        },
        jobs={"dgx07": ["981"]},
    )
    outcomes = run_heal(site, "dgx[07-09]")
    assert (outcomes["dgx07"].result, outcomes["dgx07"].detail) == ("waiting", "jobs still running: 981")
    assert outcomes["dgx08"].result == "no remedy"
    assert outcomes["dgx09"].result == "skipped" and "RMA ticket 42" in outcomes["dgx09"].detail
    assert sim.steps == [] and sim.reasons["dgx08"].startswith("corectl-health:")


def test_a_node_that_recovered_by_itself_is_just_resumed(site: Site, simulate) -> None:
    sim = simulate({"dgx10": "corectl-health: fabricmanager: nv-fabricmanager is not running"})
    sim.faults["dgx10"] = None
    assert run_heal(site)["dgx10"].detail == "the checks pass again"
    assert sim.steps == []


def test_a_site_ladder_overrides_the_shared_one(site: Site, simulate) -> None:
    (site.directory / "group_vars").mkdir()
    (site.directory / "group_vars" / "all.yml").write_text(
        textwrap.dedent("""\
            corectl_heal_ladders:
              xid: [power-cycle]
        """)
    )
    sim = simulate({"dgx11": "corectl-health: xid: Xid 79 on GPU 3"})
    assert run_heal(site)["dgx11"].result == "resumed"
    assert sim.steps == [("power-cycle", ("dgx11",))]


# --------------------------------------------------------------------------- node states for Prometheus


def slurm_metrics_module():
    import importlib.machinery
    import importlib.util

    path = ROOT / "roles" / "slurm" / "files" / "corectl-slurm-metrics"
    loader = importlib.machinery.SourceFileLoader("corectl_slurm_metrics", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_node_states_say_why_each_drained_node_is_drained():
    import subprocess

    metrics = slurm_metrics_module()
    sinfo = subprocess.CompletedProcess(
        [],
        0,
        stdout="\n".join(
            [
                "dgx01|idle|none",
                "dgx02|drain|corectl-health: xid: Xid 79 on GPU 3",
                "dgx03|drain*|corectl: needs hardware service (gpu-count)",
                'dgx04|drng|DIMM "B2" swap',
                "dgx05|alloc|none",
                "dgx01|idle|none",  # a node in two partitions is listed twice
            ]
        ),
    )
    text = metrics.metrics(sinfo, 1795420000.4)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [
        "corectl_slurm_up 1",
        "corectl_slurm_metrics_time_seconds 1795420000",
        'corectl_slurm_nodes{state="alloc"} 1',
        'corectl_slurm_nodes{state="drain"} 2',
        'corectl_slurm_nodes{state="drng"} 1',
        'corectl_slurm_nodes{state="idle"} 1',
        'corectl_slurm_node_drained{slurm_node="dgx02",cause="health",check="xid"} 1',
        'corectl_slurm_node_drained{slurm_node="dgx03",cause="service",check="gpu-count"} 1',
        'corectl_slurm_node_drained{slurm_node="dgx04",cause="other",check=""} 1',
    ]
    down = metrics.metrics(subprocess.CompletedProcess([], 1, stdout=""), 5.0)
    assert "corectl_slurm_up 0" in down and "corectl_slurm_nodes" not in down


# scontrol --oneliner lines as Slurm 22.05 prints them on the lab (shortened: the fields the metrics read kept)
SCONTROL_NODES = """\
NodeName=dgx01 CPUAlloc=1 Gres=gpu:h100:8 State=MIXED ThreadsPerCore=1 CfgTRES=cpu=2,mem=1G,billing=6,gres/gpu=8 AllocTRES=cpu=1,mem=512M,gres/gpu=2 CapWatts=n/a
NodeName=dgx02 CPUAlloc=0 Gres=gpu:h100:8 State=IDLE+DRAIN ThreadsPerCore=1 CfgTRES=cpu=2,mem=1G,billing=6,gres/gpu=8 AllocTRES= CapWatts=n/a Reason=corectl-health: xid: Xid 79 [root@2026-11-26T22:35:15]
NodeName=dgx03 CPUAlloc=0 Gres=gpu:h100:8 State=UNKNOWN+NOT_RESPONDING ThreadsPerCore=1 CfgTRES=cpu=2,mem=1G,gres/gpu=8 AllocTRES= CapWatts=n/a
NodeName=head01 CPUAlloc=0 Gres=(null) State=IDLE ThreadsPerCore=1 CfgTRES=cpu=2,mem=1G,billing=2 AllocTRES= CapWatts=n/a
"""  # noqa: E501
SCONTROL_JOBS = """\
JobId=1 JobName=wrap UserId=alice(20001) GroupId=research(20000) MCS_label=N/A Priority=1 Nice=0 Account=research QOS=normal JobState=RUNNING Reason=None Partition=batch NodeList=dgx01 TRES=cpu=1,mem=512M,node=1,billing=2,gres/gpu=2 Command=/home/alice/my job.sh WorkDir=/home/alice TresPerJob=gres:gpu:2
JobId=2 JobName=wrap UserId=alice(20001) GroupId=research(20000) Account=research QOS=normal JobState=PENDING Reason=Resources Partition=batch NodeList= TRES=cpu=2,mem=1G,node=2,billing=8,gres/gpu=16 TresPerNode=gres:gpu:8
JobId=3 JobName=cpu UserId=carol(20003) GroupId=hpcadmin(20010) Account=hpcadmin QOS=normal JobState=RUNNING Reason=None Partition=low NodeList=dgx01 TRES=cpu=1,mem=512M,node=1,billing=1
JobId=4 JobName=old UserId=carol(20003) GroupId=hpcadmin(20010) Account=hpcadmin QOS=normal JobState=COMPLETED Reason=None Partition=low NodeList=dgx01 TRES=cpu=1,mem=512M,node=1,billing=1
"""  # noqa: E501


def test_gpus_and_jobs_are_counted_for_the_dashboards():
    """The GPUs by state and each running job with its user, account and GPUs (labelled hpc_job as dcgm-exporter
    labels a job's GPUs), read from scontrol; a free-text field with spaces (Command=) does not confuse it."""
    import subprocess

    metrics = slurm_metrics_module()
    answer = subprocess.CompletedProcess
    text = metrics.metrics(
        answer([], 0, stdout="dgx01|mix|none\n"), 0.0, answer([], 0, stdout=SCONTROL_NODES),
        answer([], 0, stdout=SCONTROL_JOBS),
    )  # fmt: skip
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines[3:] == [
        'corectl_slurm_gpus{state="allocated"} 2',
        'corectl_slurm_gpus{state="idle"} 6',
        'corectl_slurm_gpus{state="unavailable"} 16',  # a drained node's and a node not responding
        'corectl_slurm_jobs{state="running"} 2',
        'corectl_slurm_jobs{state="pending"} 1',
        'corectl_slurm_jobs{state="completed"} 1',
        'corectl_slurm_job_gpus{hpc_job="1",user="alice",account="research",partition="batch"} 2',
        'corectl_slurm_job_gpus{hpc_job="3",user="carol",account="hpcadmin",partition="low"} 0',
    ]
    # scontrol failing leaves the node states: no GPU or job series rather than wrong ones
    failed = metrics.metrics(answer([], 0, stdout="dgx01|mix|none\n"), 0.0, answer([], 1, ""), answer([], 1, ""))
    assert "corectl_slurm_gpus" not in failed and "corectl_slurm_jobs" not in failed
    assert 'corectl_slurm_nodes{state="mix"} 1' in failed


def test_the_node_states_file_is_replaced_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import subprocess

    metrics = slurm_metrics_module()
    answer = subprocess.CompletedProcess([], 0, stdout="dgx01|idle|none\n")
    monkeypatch.setattr(metrics.subprocess, "run", lambda *a, **k: answer)
    out = tmp_path / "corectl_slurm.prom"
    assert metrics.main(["corectl-slurm-metrics", str(out)]) == 0
    assert 'corectl_slurm_nodes{state="idle"} 1' in out.read_text()
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["corectl_slurm.prom"]


def test_an_ipmi_password_over_20_bytes_is_one_clear_line(site: Site) -> None:
    from corectl.bmc import Credentials

    edit_nodes(site, "bmc: {address: 10.10.9.17, protocol: redfish}", "bmc: {address: 10.10.9.17, protocol: ipmi}")
    nodes = power_cmd.bmc_nodes(load_cluster(site.directory), "dgx07")
    [result] = power_cmd.apply(site, nodes, "status", Credentials("admin", "x" * 21), 5)
    assert not result.ok
    assert result.detail == "BMC 10.10.9.17:623 (ipmi): IPMI passwords are at most 20 bytes (corectl secrets set-bmc)"


def test_heal_names_a_bad_node_list_or_a_node_that_is_not_a_compute_node(site: Site, simulate) -> None:
    simulate({})
    with pytest.raises(CorectlError, match="not compute nodes of site prod: head01"):
        run_heal(site, "head01,dgx01")
    with pytest.raises(CorectlError, match=r"^NODES: "):
        run_heal(site, "dgx[01-")
