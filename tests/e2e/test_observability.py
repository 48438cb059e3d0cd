"""Observability: the GPU stack's metrics, every dashboard panel, logs at the head, the report."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest

from e2e.lab import (
    DGX1,
    DGX2,
    HEAD,
    SITE,
    P,
    by_hand,
    corectl,
    docker_exec,
    job_state,
    prometheus,
    sbatch,
    slurm_reason,
    slurmd_registered,
    wait_for,
)

pytestmark = pytest.mark.lab


def test_gpu_stack_monitoring_and_containers(lab: Path):
    head, dgx = f"corectl-{SITE}-{P}head01", f"corectl-{SITE}-{P}dgx01"
    # the driver, Fabric Manager and DCGM from the stand-in repository, at the declared versions
    versions = docker_exec(
        dgx, "dpkg-query", "-W", "-f=${Package}=${Version}\\n", "cuda-drivers-580", "nvidia-fabricmanager"
    )
    assert versions.split() == ["cuda-drivers-580=580.95.05-1", "nvidia-fabricmanager=580.95.05-1"]
    assert (
        docker_exec(dgx, "nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").split()
        == ["580.95.05"] * 8
    )
    # Prometheus on the head node scrapes every node and the GPU node's dcgm-exporter
    deadline = time.monotonic() + 120
    while True:
        targets = prometheus(head, "/api/v1/targets")["data"]["activeTargets"]
        health = sorted((t["labels"].get("node", "self"), t["labels"]["job"], t["health"]) for t in targets)
        if (health and all(h[2] == "up" for h in health)) or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert health == [
        (f"{P}dgx01", "dcgm", "up"),
        (f"{P}dgx01", "node", "up"),
        (f"{P}dgx02", "dcgm", "up"),
        (f"{P}dgx02", "node", "up"),
        (f"{P}head01", "node", "up"),
        ("self", "prometheus", "up"),
    ]
    series = prometheus(head, "/api/v1/query?query=DCGM_FI_DEV_GPU_TEMP")["data"]["result"]
    per_node = sorted((s["metric"]["node"], int(s["metric"]["gpu"])) for s in series)
    assert per_node == [(node, gpu) for node in (f"{P}dgx01", f"{P}dgx02") for gpu in range(8)]


DASHBOARDS = Path(__file__).resolve().parents[2] / "roles" / "monitoring" / "files" / "dashboards"


# what a Grafana viewer picks (node, user) and Grafana fills in (range, rate interval), to run a panel's query by hand
PANEL_VARIABLES = {"$node": f"{P}dgx01", "$user": "alice", "$__range": "1h", "$__rate_interval": "1m"}


# node_exporter reads InfiniBand counters only from /sys/class/infiniband, which containers do not have (the stand-in
# ports live in gpu-sim's own tree): that panel's query must run, but has no series here (docs/testing.md)
NO_SERIES_ON_STANDINS = {"InfiniBand receive errors"}


LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def grafana(path: str) -> Any:
    """GET from Grafana on the head, as a viewer without an account."""
    code = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:3000{path}').read().decode())"
    return json.loads(docker_exec(HEAD, "python3", "-c", code))


def panel_query(expr: str) -> dict:
    for name, value in PANEL_VARIABLES.items():
        expr = expr.replace(name, value)
    return prometheus(HEAD, f"/api/v1/query?query={urllib.parse.quote(expr)}")


def test_every_dashboard_panel_answers_from_prometheus_and_alices_job_is_under_alice(lab: Path):
    """Issue 29: Grafana serves corectl's dashboards as generated; every panel's query, run against the lab's live
    Prometheus, returns series with the labels its legend groups by; a GPU job of alice's is under alice."""
    shipped = {json.loads(p.read_text())["uid"]: json.loads(p.read_text()) for p in DASHBOARDS.glob("*.json")}
    assert sorted(d["uid"] for d in grafana("/api/search?type=dash-db")) == sorted(shipped)
    for uid, board in shipped.items():
        assert grafana(f"/api/dashboards/uid/{uid}")["dashboard"] == board  # provisioned as the repository has it
    # what the panels show: the GPUs at work (gpu-sim's utilisation, what dcgm-exporter reads), a job of alice's on
    # two of them, a drained node
    for gpu in range(8):
        docker_exec(DGX1, "gpu-sim", "set", f"gpus.{gpu}.utilization_pct", "80")
        docker_exec(DGX1, "gpu-sim", "set", f"gpus.{gpu}.memory_used_mib", "40960")
    job = sbatch("--gpus=2", f"--nodelist={P}dgx01", "--wrap", "sleep 600")
    corectl("drain", f"{P}dgx02", "--reason", "e2e dashboards", "--inventory", str(lab))
    try:
        wait_for(lambda: job_state(job), lambda s: s.startswith("RUNNING"), 120)
        docker_exec(HEAD, "systemctl", "start", "corectl-slurm-metrics.service")  # as its timer would, sooner
        panels = {p["title"]: p["targets"][0]["expr"] for p in shipped["corectl-jobs"]["panels"]}

        def per_user() -> list[tuple[str, float]]:
            result = panel_query(panels["GPU utilisation per user"])["data"]["result"]
            return [(s["metric"]["user"], float(s["value"][1])) for s in result]

        # dcgm-exporter reads gpu-sim each collection and Prometheus scrapes it: wait for both GPUs at 80 under alice
        assert wait_for(per_user, lambda r: r == [("alice", 80.0)], 180) == [("alice", 80.0)]
        wait_for(lambda: panel_query("corectl_slurm_node_drained")["data"]["result"], bool, 120)
        targets = [
            (f"{uid} / {panel['title']}: {target['expr']}", panel["title"], target)
            for uid, board in sorted(shipped.items()) for panel in board["panels"] for target in panel["targets"]
        ]  # fmt: skip

        def faults() -> list[str]:
            """Every panel's query, run now: what is wrong with the answers (nothing: all good)."""
            found = []
            for where, title, target in targets:
                answer = panel_query(target["expr"])
                result = answer["data"]["result"] if answer["status"] == "success" else None
                if result is None:
                    found.append(f"{where}: {answer}")
                elif not result and title not in NO_SERIES_ON_STANDINS:
                    found.append(f"{where}: no series")
                found += [
                    f"{where}: no {label} label"
                    for label in LEGEND_LABEL.findall(target["legendFormat"])
                    if not all(label in series["metric"] for series in result or [])
                ]
            return found

        # GPU-hours are sampled on whole minutes (a subquery): a job that began seconds ago has none until the next
        assert wait_for(faults, lambda found: not found, 180) == []
        assert len(targets) >= 20
        # alice's job is under alice in the per-user panels: her two GPUs, at the utilisation gpu-sim gives them
        held = panel_query(panels["GPUs held per user"])["data"]["result"]
        # (a job without GPUs, another test's, would hold 0)
        assert [(s["metric"]["user"], float(s["value"][1])) for s in held if float(s["value"][1])] == [("alice", 2.0)]
        per_job = panel_query(panels["GPU utilisation per job"])["data"]["result"]
        assert {(s["metric"]["hpc_job"], s["metric"]["node"]) for s in per_job} == {(job, f"{P}dgx01")}
        assert len(per_job) == 2
        drained = panel_query("corectl_slurm_node_drained")["data"]["result"]
        assert [(s["metric"]["slurm_node"], s["metric"]["cause"]) for s in drained] == [(f"{P}dgx02", "other")]
    finally:
        docker_exec(HEAD, "scancel", job, check=False)
        corectl("resume", f"{P}dgx02", "--inventory", str(lab))
        for gpu in range(8):
            docker_exec(DGX1, "gpu-sim", "set", f"gpus.{gpu}.utilization_pct", "0")
            docker_exec(DGX1, "gpu-sim", "set", f"gpus.{gpu}.memory_used_mib", "0")
        wait_for(lambda: job_state(job), lambda s: s == "", 120)


def test_every_nodes_logs_reach_the_head_and_are_read_there_while_the_node_is_down(lab: Path):
    """Issue 29: each node's rsyslog forwards its journal to the head over TCP; `corectl logs NODE` reads the
    head's copy (named from the sender's address), also while the node is stopped: a line logged by a program,
    and an Xid from the stand-in's kernel log (gpu-sim puts each in the node's journal as a kernel line; an
    application Xid, 13, drains nothing)."""
    args = ("--inventory", str(lab))
    marker = f"e2e-logs-{uuid.uuid4().hex[:8]}"
    for container, node in ((DGX1, f"{P}dgx01"), (DGX2, f"{P}dgx02")):
        docker_exec(container, "logger", "-t", "e2e", f"{marker} from {node}")
    read = ("logs", f"{P}dgx02", *args, "--grep", marker)

    def dgx02_lines(*options: str) -> list[str]:
        return corectl("logs", f"{P}dgx02", *args, *options, check=False).stdout.splitlines()

    seen = wait_for(lambda: dgx02_lines("--grep", marker), lambda lines: len(lines) == 1, 90)
    assert seen[0].endswith(f" e2e: {marker} from {P}dgx02"), seen
    docker_exec(DGX2, "gpu-sim", "fault", "xid", "--gpu", "6", "--xid", "13")
    [xid] = docker_exec(DGX2, "gpu-sim", "kernel-log").splitlines()[-1:]
    assert xid.startswith("NVRM: Xid (PCI:") and ": 13, " in xid, xid
    # (that very line: other lines mention Xids too, such as Ansible's record of the health checker's settings)
    that_xid = ("--grep", re.escape(xid))
    kernel = wait_for(lambda: dgx02_lines(*that_xid), lambda lines: len(lines) == 1, 90)
    assert f" {P}dgx02 kernel" in kernel[0] and kernel[0].endswith(f": {xid}"), kernel
    before = slurmd_registered(f"{P}dgx02")
    subprocess.run(["docker", "stop", DGX2], capture_output=True, check=True)
    try:
        down = corectl(*read).stdout.splitlines()  # the node is down: its lines are on the head
        assert down == seen
        assert dgx02_lines(*that_xid) == kernel
        since = corectl("logs", f"{P}dgx01", *args, "--grep", marker, "--since", "10m").stdout.splitlines()
        assert len(since) == 1 and since[0].endswith(f" e2e: {marker} from {P}dgx01"), since
    finally:
        subprocess.run(["docker", "start", DGX2], capture_output=True, check=True)
        # back for the next test once its new slurmd has registered and it is idle
        wait_for(lambda: slurmd_registered(f"{P}dgx02"), lambda started: started != before, 240)
        wait_for(lambda: slurm_reason(f"{P}dgx02"), lambda reason: reason == "idle|none", 240)
    missing = corectl("logs", f"{P}nosuch", *args, check=False)
    assert missing.returncode == 2 and f"{P}nosuch is not a node of" in missing.stderr


def test_the_report_shows_the_accountings_gpu_hours_the_utilisation_and_its_plots(lab: Path, tmp_path: Path):
    from corectl.health import page
    from corectl.health.charts import WIDTH
    from screenshot import bars, runs, screenshot

    # GPU jobs of alice under two accounts and of carol under her default one (hpcadmin), a few seconds each
    ran = []
    for user, account, gres in (("alice", "research", "gpu:2"), ("alice", "vision", "gpu:1"), ("carol", "", "gpu:1")):
        job = docker_exec(
            HEAD, "runuser", "-u", user, "--", "srun", *([f"--account={account}"] if account else []),
            f"--nodelist={P}dgx02", "--ntasks=1", "--cpus-per-task=1", "--mem=64", f"--gres={gres}",
            "sh", "-c", 'sleep 5; echo "$SLURM_JOB_ID"',
        ).strip()  # fmt: skip
        ran.append(job)
    # slurmctld hands each job's record to slurmdbd through a queue: wait for them all to be there, ended
    wait_for(
        lambda: docker_exec(HEAD, "sacct", "-X", "-n", "-P", "-j", ",".join(ran), "-o", "JobID,State"),
        lambda out: out.count("COMPLETED") == len(ran),
        60,
    )
    html = tmp_path / "report.html"
    shown = json.loads(corectl("report", "--inventory", str(lab), "--days", "1", "--json", "--html", str(html)).stdout)
    # the same window, read on the head here and counted by hand (sacct reads its times as UTC with TZ=UTC)
    start, end = (shown[key].removesuffix("Z") for key in ("since", "until"))
    sacct = docker_exec(
        HEAD, "env", "TZ=UTC", "sacct", "-a", "-X", "-n", "-P", "--noconvert", "--truncate", f"-S{start}", f"-E{end}",
        "--format=JobID,User,Account,AllocTRES,ElapsedRaw,State",
    )  # fmt: skip
    accounts, users = by_hand(sacct)
    assert {"research", "vision", "hpcadmin"} <= set(accounts) and {"alice", "carol"} <= set(users), sacct
    used = shown["usage"]
    assert used is not None, shown["usage_note"]
    for mine, theirs in ((accounts, used["accounts"]), (users, used["users"])):
        assert {s["name"]: s["jobs"] for s in theirs} == {name: jobs for name, (jobs, _) in mine.items()}
        assert {s["name"]: s["gpu_hours"] for s in theirs} == pytest.approx({n: h for n, (_, h) in mine.items()})
    series = shown["utilisation"]
    assert series is not None, shown["utilisation_note"]
    assert len(series["times"]) > 0 and max(series["gpus"]) >= 16  # both stand-ins' 8 GPUs each were sampled
    # the page: its plots, and in headless Chromium no error, the bars as long as the figures say, the lines drawn
    text = html.read_text()
    assert text.count("<svg") == 5 and "GPU-hours per account" in text and "GPU utilisation (%)" in text
    # a window taller than the page (its length grows with the lab's accounts, users and outages): the whole page
    # is in the shot when its last rows are blank
    image, errors = screenshot(html, tmp_path / "report.png", tmp_path / "profile", height=6000)
    assert errors == []
    assert set(b"".join(image.rows[-200:])) == {0xFF}, "the page is longer than the screenshot"
    plot = WIDTH - 220 - 130  # charts.bar_chart's plot width

    def widths(shares: list[dict]) -> list[int]:
        top = max(s["gpu_hours"] for s in shares)
        return [w for s in shares if (w := round(plot * s["gpu_hours"] / top)) > 0]

    assert bars(image, page.ACCOUNT_COLOUR) == pytest.approx(widths(used["accounts"]), abs=1)
    assert bars(image, page.USER_COLOUR) == pytest.approx(widths(used["users"]), abs=1)
    # the lab is minutes old in a day's report: its few samples are dots at the plots' right end, each chart's colour
    # also in rows below its legend's swatch
    for colour in (page.UTIL_COLOUR, page.BUSY_COLOUR):
        rows = sorted({y for y, _x, _n in runs(image, colour)})
        assert rows and rows[-1] - rows[0] > 15, f"{colour}: no sample drawn below the legend"
    causes = page.cause_colours(o["cause"] for o in shown["out_of_service"])
    for cause, colour in causes.items():
        assert bars(image, colour, min_height=15), f"no bar of {cause} on the timeline"
