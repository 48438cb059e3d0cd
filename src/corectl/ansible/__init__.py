"""The one boundary to Ansible: the only package that imports ansible_runner.

`run(request)` runs a RunRequest: node-local or fanned out over the site's runner hosts when cluster.yml says so
(`node_local:`, `control.runners`) and the request allows it (`request.fan_out`), else from this host.
Below it: `events` (a run's request and result, and its events classified once), `lifecycle` (every run's one start
and end: id and folder, cancel, events, merged host counts, record), `runner` (the transport that runs ansible-runner
on this host), `guard` (the ansible-playbook that never outlives corectl), `records` (run records written, pruned and
read back), and `remote/` (shards, job packs, runner hosts; the fanned and node-local transports). The live display
(corectl.progress) is a consumer of the events above this boundary.
"""

from __future__ import annotations

from corectl.ansible.events import (
    EventSink,
    Returned,
    RunRequest,
    RunResult,
    changed_paths,
    failure_detail,
    reported_change,
)
from corectl.ansible.remote import nodelocal
from corectl.ansible.remote.fanout import run_fanned
from corectl.ansible.runner import run_playbook, run_standalone
from corectl.site.loader import load_cluster
from corectl.site.model import Cluster

__all__ = [
    "EventSink",
    "Returned",
    "RunRequest",
    "RunResult",
    "changed_paths",
    "failure_detail",
    "node_local_declined",
    "reported_change",
    "run",
    "run_standalone",
]


def node_local_declined(request: RunRequest, cluster: Cluster) -> str:
    """Why a run that node_local auto would run node-local goes from this host (the site's unmet need), or ""."""
    return nodelocal.auto_declined(request, cluster)


def run(request: RunRequest, sink: EventSink | None = None, *, cluster: Cluster | None = None) -> RunResult:
    """Run ``request`` (``sink`` sees every event): node-local, over the runners or here, as it says."""
    if request.fan_out and request.record:  # a read-only command's run is one host's work, from here
        cluster = cluster or load_cluster(request.site.directory)
        nodes = nodelocal.chosen(request, cluster)
        if nodes:
            return nodelocal.run_node_local(request, cluster, nodes, sink)
        if cluster.config.control is not None:
            return run_fanned(request, cluster, sink)
    return run_playbook(request, sink=sink)
