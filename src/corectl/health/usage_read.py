"""corectl report's reads on the head (playbooks/report.yml): the period's jobs from Slurm's accounting
on the controller and the GPU utilisation series from Prometheus on the monitoring node, each parsed
(corectl.health.usage) or, when it could not be read, one line saying why."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from corectl import ansible
from corectl.ansible import Returned, RunRequest
from corectl.errors import CorectlError
from corectl.health.usage import (
    UTILISATION_QUERY,
    UnreadableAnswer,
    Usage,
    UsageRead,
    Utilisation,
    parse_query_range,
    parse_sacct,
    step_for,
    usage,
)
from corectl.site.context import Context

# what playbooks/report.yml hands back: sacct's answer on the controller, Prometheus's on the monitoring node
SACCT, PROMETHEUS = "corectl_sacct", "corectl_prometheus"


def extravars(since: datetime, until: datetime) -> dict[str, Any]:
    """The playbook's period (UTC, as sacct reads it with TZ=UTC, and epoch seconds) and query."""
    start, end = int(since.timestamp()), int(until.timestamp())
    return {
        "corectl_report_start": since.strftime("%Y-%m-%dT%H:%M:%S"),
        "corectl_report_end": until.strftime("%Y-%m-%dT%H:%M:%S"),
        "corectl_report_start_s": start,
        "corectl_report_end_s": end,
        "corectl_report_step": step_for(end - start),
        "corectl_report_query": UTILISATION_QUERY,
    }


def _why(host: str, read: Returned) -> str:
    """One line: why ``host`` gave no usable answer."""
    if host in read.unreachable:
        return f"{host} {read.unreachable[host]}"
    res = read.by_host.get(host)
    if res is None:
        return f"{host} gave no answer"
    said = str(res.get("stderr") or res.get("msg") or "failed").strip().splitlines()
    return f"{host}: {said[-1] if said else 'failed'}"


def usage_from(host: str, read: Returned) -> tuple[Usage | None, str]:
    res = read.by_host.get(host)
    if res is None or res.get("failed") or res.get("rc") != 0:
        return None, f"usage not read: {_why(host, read)}"
    try:
        return usage(parse_sacct(str(res.get("stdout") or ""))), ""
    except UnreadableAnswer as exc:
        return None, f"usage not read: {host}'s sacct: {exc}"


def utilisation_from(host: str, read: Returned) -> tuple[Utilisation | None, str]:
    res = read.by_host.get(host)
    if res is None or res.get("failed"):
        return None, f"utilisation not read: {_why(host, read)}"
    try:
        return parse_query_range(res.get("json") or str(res.get("content") or "")), ""
    except UnreadableAnswer as exc:
        return None, f"utilisation not read: Prometheus on {host}: {exc}"


def read_usage(ctx: Context, since: datetime, until: datetime) -> UsageRead:
    """The period's usage and utilisation as the head answers; what it cannot read is said, not raised."""
    try:
        cluster = ctx.rendered()
    except CorectlError as exc:
        return UsageRead(None, None, f"usage not read: {exc}", f"utilisation not read: {exc}")
    controller = cluster.with_role("slurm_controller")[0].name
    monitoring = [n.name for n in cluster.with_role("monitoring")][:1] if cluster.config.monitoring.prometheus else []
    accounting = [controller] if cluster.config.slurm.accounting else []
    no_usage = "usage: the site keeps no accounting (cluster.yml slurm.accounting)"
    no_series = "utilisation: the site has no Prometheus (cluster.yml monitoring.prometheus on a monitoring node)"
    if not accounting and not monitoring:
        return UsageRead(None, None, no_usage, no_series)
    sacct = Returned(SACCT, lambda _event: None)
    prometheus = Returned(PROMETHEUS, sacct)
    request = RunRequest.of(
        ctx, playbook="report.yml", command="report", limit=",".join(dict.fromkeys(accounting + monitoring)),
        extravars=extravars(since, until), secrets=False, fan_out=False,
    )  # fmt: skip
    try:
        ansible.run(request, prometheus, cluster=cluster)
    except CorectlError as exc:
        return UsageRead(None, None, f"usage not read: {exc}", f"utilisation not read: {exc}")
    used, used_note = usage_from(controller, sacct) if accounting else (None, no_usage)
    series, series_note = utilisation_from(monitoring[0], prometheus) if monitoring else (None, no_series)
    return UsageRead(used, series, used_note, series_note)
