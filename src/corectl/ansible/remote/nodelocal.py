"""Node-local runs (cluster.yml `node_local:`, issue 30, docs/scale.md): each compute node runs its
own plays of site.yml against itself.

A run of site.yml that includes the controller becomes, when node_local chooses it:

1. ``services``: every targeted node with a service role (controller, dbd, login, monitoring),
   run from this host as any run (vault password through corectl's socket, Mitogen if chosen).
   Its events also give the controller's read of its Slurm version, which the nodes' version
   check needs and cannot read themselves.
2. each compute node, ``parallel`` at a time: its job packed (corectl.ansible.remote.jobpack,
   with only its own host_vars and its own secrets) and streamed over SSH into
   `ansible-runner worker` on the node, whose ansible-playbook runs the same site.yml limited to
   the node with a local connection. The node's secrets (the munge key and the cephx keys of the
   site's mounts) are encrypted with a one-time password made for this run, which travels in the
   stream only; the site's vault password never leaves this host. The job lives on tmpfs
   (``job_dir``) and the worker removes it when it ends; Ctrl-C removes it too.
   A node without the control host's ansible-core and ansible-runner (STALE_EXIT) gets them
   (runnerhost.payload into ``install_dir``) and its job again.
3. ``control-host``: the nodes that cannot run their own job (python3 of another minor version:
   UNFIT_EXIT) run from this host as today.

One live progress (events tagged with their shard), one run record with every shard; a node that
dies mid-run fails alone (unreachable, with the reason) and the usual retry line names it.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from subprocess import Popen
from typing import Any

from corectl.ansible import lifecycle
from corectl.ansible.events import (
    CpuClock,
    EventSink,
    Returned,
    RunRequest,
    RunResult,
    ShardOutcome,
    crosses,
    slim,
    verbosity,
)
from corectl.ansible.lifecycle import Ended, Live
from corectl.ansible.remote import followers, runnerhost
from corectl.ansible.remote.fanout import runner_accelerator, targets
from corectl.ansible.remote.jobpack import NodeJob, RunnerSide, Streamed, host_vars, pack, run_streamed, zip_message
from corectl.ansible.remote.shards import SERVICE_ROLES
from corectl.ansible.runner import here, site_build
from corectl.bootstrap import key_path
from corectl.errors import CorectlError
from corectl.secrets import NodeSecrets, ceph_clients, node_secrets
from corectl.site.checks import node_local_needs
from corectl.site.model import Cluster, Node, NodeLocal, SshAccess
from corectl.site.model_services import RunnerHost
from corectl.site.yamlsrc import dotted

CONTROL_HOST = "control host"
SERVICES = "services"
FALLBACK = "control-host"
PAYLOADS = "build/node-payloads"  # under the project: the nodes' install, one per control-host version
CANCEL_S = 0.5  # how soon the node jobs running are stopped after Ctrl-C (or the run's process saying stop)
# roles/slurm/tasks/versions.yml: the controller hands back under it what each node's check compares with
POLICY = "corectl_slurm_policy"


def chosen(request: RunRequest, cluster: Cluster) -> list[str]:
    """The compute nodes this run runs node-local; [] for a run from this host (or its runners)."""
    return _route(request, cluster)[0]


def auto_declined(request: RunRequest, cluster: Cluster) -> str:
    """Why a run that auto would make node-local runs from this host instead: the site's unmet need, or ""."""
    return _route(request, cluster)[1]


def _route(request: RunRequest, cluster: Cluster) -> tuple[list[str], str]:
    """The nodes this run runs node-local, and why auto runs from here a run it would make node-local (or "").
    auto leaves a site with runners on them, and a site node-local jobs can not reach on this host."""
    nodes = _eligible(request, cluster)
    if not nodes or cluster.config.node_local.mode != "auto":
        return nodes, ""
    if cluster.config.control is not None:
        return [], ""
    needs = node_local_needs(cluster.config)
    return ([], f"{dotted(needs[0].path)}: {needs[0].message}") if needs else (nodes, "")


def _eligible(request: RunRequest, cluster: Cluster) -> list[str]:
    """The run's compute nodes when its mode, playbook and size call for node-local, whatever the site allows."""
    settings = cluster.config.node_local
    if settings.mode == "off" or request.playbook != "site.yml" or not request.fan_out:
        return []
    reached = set(targets(request.site, request.limit))
    if _controller(cluster) not in reached:
        return []  # the nodes' version check needs the controller's read of this run
    nodes = [n.name for n in cluster.nodes if n.name in reached and not SERVICE_ROLES.intersection(n.roles)]
    if settings.mode == "auto" and len(nodes) < settings.auto_from:
        return []
    return nodes


def _controller(cluster: Cluster) -> str:
    return next(n.name for n in cluster.nodes if "slurm_controller" in n.roles)


def _endpoint(node: Node) -> RunnerHost:
    """The node as an SSH endpoint, the way the control host reaches it (no validation: it is the inventory's)."""
    return RunnerHost.model_construct(name=node.name, host=node.ssh_host, port=node.ssh_port, user=node.ssh_user)


@dataclass
class _Common:
    """What every node's job of the run shares, packed and zipped once (jobpack.send): the project, the site's
    inventory without host_vars, the node secrets; and the kwargs of the job but for its limit."""

    kwargs: dict[str, Any]
    layer: bytes
    remote: PurePosixPath  # the job's directory on each node (each node has its own job_dir)


@dataclass
class _Run:
    """What every node's job needs beyond the request and its live run (id, folder, cancel, events)."""

    live: Live
    settings: NodeLocal
    key: Path
    ssh: SshAccess  # cluster.ssh: the key exchange, the jump host (client_options)
    digest: str
    common: _Common | None = None
    active: dict[str, runnerhost.Job] = field(default_factory=dict)
    guard: threading.Lock = field(default_factory=threading.Lock)

    @property
    def request(self) -> RunRequest:
        return self.live.request

    def cancel(self) -> bool:
        return self.live.cancel()


def _payload(run: _Run) -> bytes:
    """What a node's install unpacks, built once per control-host version and kept in the project's build/."""
    install_dir = PurePosixPath(run.settings.install_dir)
    return runnerhost.kept_payload(install_dir, run.digest, run.request.site.root / PAYLOADS)


def _common(run: _Run, secrets: NodeSecrets | None, policy: str, base: Path) -> _Common:
    """Pack and zip, once, what every node's job shares."""
    remote = PurePosixPath(run.settings.job_dir) / f"corectl-job-{run.live.ident}"
    # a node's own run under Mitogen when this host's is (CORECTL_ACCELERATOR=mitogen; the payload carries it):
    # mitogen_local keeps one interpreter for the node's modules instead of one per task (docs/scale.md)
    facts = PurePosixPath(run.settings.install_dir) / "facts"
    side = RunnerSide(remote_dir=remote, fact_cache=facts, accelerator=runner_accelerator())
    extravars = {**run.request.extravars, "ansible_connection": "local"}
    if policy:
        extravars["slurm_versions_controller_policy"] = policy
    request = replace(run.request, limit=None, extravars=extravars)
    mine = NodeJob("", secrets.files if secrets else {})
    kwargs = pack(request, base, run.live.ident, side, secrets.password if secrets else None, mine)
    return _Common(kwargs, zip_message(base), remote)


def _job(run: _Run, node: Node, attempt: int) -> Streamed:
    """One node's job (the common part and its own host_vars), streamed to its worker over SSH, followed to its end."""
    assert run.common is not None
    remote, host, options = run.common.remote, _endpoint(node), run.ssh.client_options(node.jump_host)
    work_dir = run.live.run_dir / "shards" / node.name / str(attempt)
    work_dir.mkdir(parents=True, exist_ok=True)

    def on_start(worker: Popen[bytes]) -> None:
        with run.guard:
            run.active[node.name] = (worker, remote, host, options)

    with tempfile.TemporaryDirectory(prefix="corectl-pack-") as tmp:
        own = Path(tmp) / "job"
        own.mkdir()
        host_vars(run.request.site.directory, node.name, own)
        kwargs = {**run.common.kwargs, "private_data_dir": str(own), "limit": node.name}
        command = runnerhost.worker_command(run.settings.install_dir, remote, run.digest, "node")
        argv = runnerhost.ssh_argv(run.request.site, host, run.key, command, options)
        tagged = run.live.tagged(node.name)
        done = run_streamed(kwargs, argv, work_dir, tagged, on_start, consume=True, layers=[run.common.layer])
    with run.guard:
        run.active.pop(node.name, None)
    return done


def _install(run: _Run, node: Node) -> str:
    """Put the control host's ansible-core and ansible-runner on the node; '' or why not."""
    script = runnerhost.install_script(run.settings.install_dir, run.digest, "node")
    try:
        payload = _payload(run)
        options = run.ssh.client_options(node.jump_host)
        runnerhost.run_on(run.request.site, _endpoint(node), run.key, script, payload, options)
    except CorectlError as exc:
        return str(exc)
    return ""


def _node(run: _Run, node: Node) -> tuple[ShardOutcome, bool]:
    """A node's shard and whether it must run from the control host instead (its python3 cannot run the payload)."""
    started, runner = time.monotonic(), f"{node.name} (node-local)"

    def outcome(status: str, error: str = "") -> ShardOutcome:
        return ShardOutcome(node.name, runner, [node.name], status, time.monotonic() - started, error)

    if run.cancel():
        return outcome("canceled", "not started"), False
    done = _job(run, node, 1)
    if done.worker_rc == runnerhost.STALE_EXIT and not run.cancel():
        why = _install(run, node)
        if why:
            return outcome("error", why), False
        done = _job(run, node, 2)
    if done.worker_rc == runnerhost.UNFIT_EXIT:
        return outcome("unfit", done.said[-1] if done.said else "python3 is not the control host's"), True
    if run.cancel():
        return outcome("canceled", "canceled"), False
    error = ""
    if done.status not in ("successful", "failed"):
        error = done.said[-1] if done.said else f"worker exit {done.worker_rc}"
    return outcome(done.status, error), False


def _nodes(run: _Run, nodes: list[Node]) -> tuple[list[ShardOutcome], list[str]]:
    """Every node's job, ``parallel`` at a time, followed by ``processes`` processes (followers); Ctrl-C stops them
    all and removes their directories. Each node's shard and whether it must run from here instead."""
    count = processes(run.settings, len(nodes))
    if count == 1:
        return _summed(_in_threads(run, nodes, run.settings.parallel))
    each = -(-run.settings.parallel // count)  # the node jobs at once, over all the groups: ``parallel``

    def work(group: list[Node], send: EventSink) -> list[tuple[ShardOutcome, bool]]:
        live, verbose = run.live, verbosity()

        def forward(event: dict[str, Any]) -> None:
            if crosses(event, verbose):
                send(slim(event, verbose))

        # this group's run: what the run's process reads of its events sent there, which tallies and shows them
        mine = Live(live.request, live.ident, live.run_dir, live.cancel, sink=forward, counts=False)
        return _in_threads(replace(run, live=mine), group, each)  # (its own copy of the run: forked)

    def deliver(events: list[dict[str, Any]]) -> None:
        for event in events:
            run.live(event)

    groups = followers.split(nodes, count)
    ended = followers.run_groups(groups, work, deliver, run.cancel, run.live.cancel.request)
    by_name: dict[str, tuple[ShardOutcome, bool]] = {}
    for group, results in zip(groups, ended, strict=True):
        if isinstance(results, str):  # its process died: every node of its group failed, with why
            lost = _not_started([n.name for n in group], f"corectl's process for it: {results}", "error")
            by_name.update({outcome.name: (outcome, False) for outcome in lost})
        else:
            by_name.update({outcome.name: (outcome, back) for outcome, back in results})
    return _summed([by_name[node.name] for node in nodes])


def processes(settings: NodeLocal, nodes: int) -> int:
    """How many processes follow ``nodes`` node jobs: node_local.processes (default: this host's cores), no more
    than there are nodes or jobs at once."""
    return max(1, min(settings.processes or os.cpu_count() or 1, nodes, settings.parallel))


def _summed(results: list[tuple[ShardOutcome, bool]]) -> tuple[list[ShardOutcome], list[str]]:
    return [o for o, _ in results], [o.name for o, back in results if back]


def _in_threads(run: _Run, nodes: list[Node], parallel: int) -> list[tuple[ShardOutcome, bool]]:
    """``nodes``' jobs, ``parallel`` at a time in this process; Ctrl-C stops them all and removes their directories."""
    ended = threading.Event()  # a job ended: look again (not every 0.2 s of an hour-long run)
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="node-local") as pool:
        futures = [pool.submit(_node, run, node) for node in nodes]
        for future in futures:
            future.add_done_callback(lambda _future: ended.set())
        stopped: set[str] = set()
        while not all(f.done() for f in futures):
            ended.wait(CANCEL_S)  # (Ctrl-C is seen within CANCEL_S)
            ended.clear()
            if run.cancel():  # every job running now, and one that started just as Ctrl-C came
                with run.guard:
                    late = {name: job for name, job in run.active.items() if name not in stopped}
                stopped.update(late)
                if late:
                    runnerhost.stop_jobs(run.request.site, run.key, list(late.values()))
        results = []
        for node, future in zip(nodes, futures, strict=True):
            try:
                results.append(future.result())
            except (OSError, CorectlError) as exc:  # packing or starting the job here failed
                results.append((_not_started([node.name], str(exc), "error")[0], False))
    return results


def _here(run: _Run, name: str, hosts: list[str]) -> ShardOutcome:
    """Part of the run from this host, as any run here (the service nodes; the nodes unfit for their own job)."""
    started, clock = time.monotonic(), CpuClock()  # (nothing else of the run runs meanwhile: its CPU is this part's)
    request = replace(run.request, limit=",".join(hosts))
    live = run.live
    ended = here(live, site_build(request), live.run_dir / "shards", name, live.tagged(name))
    status = "canceled" if live.cancel() else ended.status
    cpu = round(sum(clock.spent().values()), 2)
    return ShardOutcome(name, CONTROL_HOST, hosts, status, time.monotonic() - started, control_cpu_s=cpu)


def _not_started(nodes: list[str], why: str, status: str = "not started") -> list[ShardOutcome]:
    return [ShardOutcome(n, f"{n} (node-local)", [n], status, 0.0, why) for n in nodes]


def run_node_local(request: RunRequest, cluster: Cluster, nodes: list[str], sink: EventSink | None = None) -> RunResult:
    """Run ``request``: the service nodes from here, then ``nodes`` each against itself; one result, one record."""
    site, settings = request.site, cluster.config.node_local
    by_name = {n.name: n for n in cluster.nodes}
    services = [t for t in targets(site, request.limit) if t not in set(nodes)]
    key = key_path(site, cluster, "node-local jobs reach the nodes with that key")
    secrets = node_secrets(site, ceph_clients(site)) if request.secrets else None
    controller = _controller(cluster)
    # the controller's read of its Slurm versions, handed back by the services' part (roles/slurm/tasks/versions.yml)
    policy = Returned(POLICY, sink or (lambda _event: None))

    def transport(live: Live) -> Ended:
        run = _Run(live, settings, key, cluster.config.cluster.ssh, runnerhost.stamp())
        outcomes = [_here(run, SERVICES, services)]
        if outcomes[0].status != "successful":
            outcomes += _not_started(nodes, f"the service nodes' part of the run ended {outcomes[0].status}")
            return Ended.of_parts(outcomes)
        with tempfile.TemporaryDirectory(prefix="corectl-common-") as base:
            run.common = _common(run, secrets, str(policy.by_host.get(controller, "")), Path(base) / "job")
            done, back = _nodes(run, [by_name[n] for n in nodes])
        outcomes += done
        if back and not live.cancel():
            outcomes.append(_here(run, FALLBACK, back))
        return Ended.of_parts(outcomes)

    return lifecycle.run(request, transport, policy)
