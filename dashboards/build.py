#!/usr/bin/env python3
"""corectl's Grafana dashboards, as code (Grafana's foundation SDK), written as JSON for role monitoring.

    python dashboards/build.py [OUTDIR]     # default: roles/monitoring/files/dashboards

Four dashboards over the site's Prometheus (data source uid ``corectl-prometheus``, which role monitoring
provisions): the cluster (GPUs allocated, idle and unavailable; jobs; nodes; drains and why), one node (its GPUs'
utilisation, memory, temperature, power, NVLink errors, Xids; InfiniBand ports; load), jobs and users (GPUs and
their utilisation per user and per job, from dcgm-exporter's ``hpc_job`` label joined to Slurm's running jobs) and
teams (GPUs held and GPU-hours per account and user). The series come from dcgm-exporter, node_exporter and
corectl-slurm-metrics (role slurm). Output is sorted and stable: running this twice writes the same bytes
(tests/unit/test_dashboards.py checks the checked-in files are what this writes; the lab e2e runs every panel's
query against a live Prometheus).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders.common import StackingConfig
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import StackingMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "roles" / "monitoring" / "files" / "dashboards"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="corectl-prometheus")
TAGS = ["corectl"]

# a running job's GPUs, its user and account labels attached to each of its GPU series (hpc_job: the job id that
# dcgm-exporter puts on a GPU's series while a job holds it); > bool 0: 1 per job that holds GPUs
JOB_LABELS = '(corectl_slurm_job_gpus{user=~"$user"} > bool 0)'


def per_job(metric: str) -> str:
    return f"{metric} * on (hpc_job) group_left (user, account) {JOB_LABELS}"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str  # Grafana's legend format; the {{labels}} it names are those the query groups by
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    kind: str  # timeseries, stacked, stat, table
    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str
    width: int = 12


def build_panel(spec: Panel) -> timeseries.Panel | stat.Panel | table.Panel:
    panel: timeseries.Panel | stat.Panel | table.Panel
    if spec.kind in ("timeseries", "stacked"):
        panel = timeseries.Panel()
        if spec.kind == "stacked":
            panel = panel.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(40)
    elif spec.kind == "stat":
        panel = stat.Panel()
    else:
        panel = table.Panel()
    panel = panel.title(spec.title).description(spec.description).unit(spec.unit).datasource(DATASOURCE)
    panel = panel.span(spec.width).height(8)
    for ref, query in zip("ABCDEFGH", spec.queries, strict=False):
        target = prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(ref).datasource(DATASOURCE)
        panel = panel.with_target(target.instant() if query.instant else target.range())
    return panel


def variable(name: str, label: str, query: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DATASOURCE)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(1)
    )


def build(uid: str, title: str, description: str, panels: list[Panel], *variables: dashboard.QueryVariable) -> dict:
    board = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .refresh("1m")
        .time("now-6h", "now")
        .timezone("browser")
        .editable()
    )
    for var in variables:
        board = board.with_variable(var)
    for spec in panels:
        board = board.with_panel(build_panel(spec))
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


CLUSTER = [
    Panel(
        "stacked",
        "GPUs by state",
        "none",
        (Query("corectl_slurm_gpus", "{{state}}"),),
        "GPUs allocated to jobs, idle, and unavailable (not allocated, on a drained or down node), as Slurm sees "
        "them (corectl-slurm-metrics on the controller).",
    ),
    Panel(
        "timeseries",
        "GPU utilisation, all GPUs",
        "percent",
        (Query("avg(DCGM_FI_DEV_GPU_UTIL)", "mean"), Query('avg(DCGM_FI_DEV_GPU_UTIL{hpc_job!=""})', "GPUs in jobs")),
        "Mean utilisation of every GPU, and of the GPUs jobs hold (dcgm-exporter).",
    ),
    Panel(
        "timeseries",
        "Jobs",
        "none",
        (Query('corectl_slurm_jobs{state=~"running|pending"}', "{{state}}"),),
        "Running and pending jobs (the queue).",
    ),
    Panel(
        "stacked",
        "Nodes by Slurm state",
        "none",
        (Query("corectl_slurm_nodes", "{{state}}"),),
        "Compute nodes by Slurm state (idle, mix, alloc, drain, down, ...).",
    ),
    Panel(
        "table",
        "Drained nodes and why",
        "none",
        (Query("corectl_slurm_node_drained", "{{slurm_node}} {{cause}}", instant=True),),
        "Each drained node with its cause, and the check as a column: health (a failed check, named), service "
        "(corectl heal gave up: needs hardware service) or other (an operator, an upgrade, Slurm: no check).",
    ),
    Panel(
        "table",
        "Scrape targets (0: down)",
        "none",
        (Query("min by (job, node, instance) (up)", "{{job}} {{instance}}", instant=True),),
        "Every exporter Prometheus scrapes, by node: 1 answering, 0 down (alert ExporterDown).",
    ),
    Panel(
        "timeseries",
        "Scrape targets up",
        "none",
        (Query("sum by (job) (up)", "{{job}}"),),
        "Targets answering, per exporter.",
    ),
]

NODE_FILTER = 'node="$node"'
NODE = [
    Panel(
        "timeseries",
        "GPU utilisation",
        "percent",
        (Query(f"DCGM_FI_DEV_GPU_UTIL{{{NODE_FILTER}}}", "GPU {{gpu}}"),),
        "Each GPU's utilisation.",
    ),
    Panel(
        "timeseries",
        "GPU memory used",
        "decmbytes",
        (Query(f"DCGM_FI_DEV_FB_USED{{{NODE_FILTER}}}", "GPU {{gpu}}"),),
        "Each GPU's framebuffer memory in use.",
    ),
    Panel(
        "timeseries",
        "GPU temperature",
        "celsius",
        (Query(f"DCGM_FI_DEV_GPU_TEMP{{{NODE_FILTER}}}", "GPU {{gpu}}"),),
        "Each GPU's temperature (alert GpuTemperatureHigh above the site's threshold).",
    ),
    Panel(
        "timeseries",
        "GPU power",
        "watt",
        (Query(f"DCGM_FI_DEV_POWER_USAGE{{{NODE_FILTER}}}", "GPU {{gpu}}"),),
        "Each GPU's power draw.",
    ),
    Panel(
        "timeseries",
        "NVLink CRC errors",
        "cps",
        (
            Query(
                f"rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{NODE_FILTER}}}[$__rate_interval])", "GPU {{gpu}}"
            ),
        ),
        "NVLink flow-control CRC errors per second, per GPU (a rising rate: a link to look at).",
    ),
    Panel(
        "timeseries",
        "Last Xid",
        "none",
        (Query(f"DCGM_FI_DEV_XID_ERRORS{{{NODE_FILTER}}}", "GPU {{gpu}}"),),
        "The last Xid each GPU reported (0: none); corectl's health checks judge and drain (docs/operations.md).",
    ),
    Panel(
        "timeseries",
        "InfiniBand receive errors",
        "cps",
        (
            Query(
                f"rate(node_infiniband_port_errors_received_total{{{NODE_FILTER}}}[$__rate_interval])",
                "{{device}} port {{port}}",
            ),
        ),
        "Receive errors per second on each InfiniBand port (node_exporter's infiniband collector; none on a node "
        "without InfiniBand).",
    ),
    Panel(
        "timeseries",
        "Load",
        "none",
        (Query(f"node_load1{{{NODE_FILTER}}}", "load1"),),
        "The node's one-minute load average.",
    ),
]

JOBS = [
    Panel(
        "stacked",
        "GPUs held per user",
        "none",
        (Query('sum by (user) (corectl_slurm_job_gpus{user=~"$user"})', "{{user}}"),),
        "GPUs allocated to each user's running jobs.",
    ),
    Panel(
        "timeseries",
        "GPU utilisation per user",
        "percent",
        (Query(f"avg by (user) ({per_job('DCGM_FI_DEV_GPU_UTIL')})", "{{user}}"),),
        "Mean utilisation of the GPUs each user's jobs hold (low: GPUs held but idle).",
    ),
    Panel(
        "timeseries",
        "GPU utilisation per job",
        "percent",
        (Query(per_job("DCGM_FI_DEV_GPU_UTIL"), "{{user}} job {{hpc_job}} {{node}} GPU {{gpu}}"),),
        "Each GPU of each running job.",
    ),
    Panel(
        "timeseries",
        "GPU memory per job",
        "decmbytes",
        (Query(f"sum by (user, hpc_job) ({per_job('DCGM_FI_DEV_FB_USED')})", "{{user}} job {{hpc_job}}"),),
        "Framebuffer memory in use by each running job, over all its GPUs.",
    ),
]

TEAMS = [
    Panel(
        "stacked",
        "GPUs held per account",
        "none",
        (Query("sum by (account) (corectl_slurm_job_gpus)", "{{account}}"),),
        "GPUs allocated to each account's (team's) running jobs.",
    ),
    Panel(
        "table",
        "GPU-hours per account",
        "none",
        (
            Query(
                "sum by (account) (sum_over_time((sum by (account) (corectl_slurm_job_gpus))[$__range:1m])) / 60",
                "{{account}}",
                instant=True,
            ),
        ),
        "GPU-hours each account's jobs held over the dashboard's time range (sampled each minute). The "
        "accounting database's figures: corectl report.",
    ),
    Panel(
        "table",
        "GPU-hours per user",
        "none",
        (
            Query(
                "sum by (account, user) (sum_over_time((sum by (account, user) (corectl_slurm_job_gpus))"
                "[$__range:1m])) / 60",
                "{{account}} {{user}}",
                instant=True,
            ),
        ),
        "GPU-hours each user's jobs held over the time range, with their account.",
    ),
]

DASHBOARDS = {
    "cluster": ("corectl-cluster", "corectl / Cluster", "The cluster at a glance: GPUs, jobs, nodes, drains.", CLUSTER,
                ()),
    "node": ("corectl-node", "corectl / Node", "One node's GPUs, fabric and load.", NODE,
             (variable("node", "node", 'label_values(up{job="node"}, node)'),)),
    "jobs": ("corectl-jobs", "corectl / Jobs and users", "How each user's running jobs use their GPUs.", JOBS,
             (variable("user", "user", "label_values(corectl_slurm_job_gpus, user)").include_all(True)
              .all_value(".*").multi(True),)),
    "teams": ("corectl-teams", "corectl / Teams", "GPUs and GPU-hours per account (team) and user.", TEAMS, ()),
}  # fmt: skip


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    files = {}
    for name, (uid, title, description, panels, variables) in DASHBOARDS.items():
        board = build(uid, title, description, panels, *variables)
        files[f"{name}.json"] = json.dumps(board, indent=2, sort_keys=True) + "\n"
    return files


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else OUT
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (out / name).write_text(text)
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
