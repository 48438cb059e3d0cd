"""A run fanned out over runner hosts (cluster.yml `control:`): one run, many shards.

Each shard (corectl.ansible.remote.shards) is packed (corectl.ansible.remote.jobpack), streamed over SSH into
`ansible-runner worker` on its runner and its events processed here as they come, tagged with
the shard's name, into the one live progress and the one run record (.runs/<id>/corectl.json,
with a "shards" list; each shard's own ansible-runner artifacts under .runs/<id>/shards/).

A shard whose runner cannot be reached, is not at the control host's versions or goes away
mid-run fails alone: its hosts are reported unreachable with the reason, so the usual "retry
just those" line names exactly them. Ctrl-C, SIGTERM and SIGHUP stop every shard: the local
SSH is closed and each runner is told to stop its job and remove the job's directory.
"""

from __future__ import annotations

import functools
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from subprocess import Popen
from typing import Any

from corectl.ansible import lifecycle
from corectl.ansible.events import EventSink, RunRequest, RunResult, ShardOutcome
from corectl.ansible.lifecycle import Ended, Live
from corectl.ansible.remote import runnerhost, shards
from corectl.ansible.remote.jobpack import RunnerSide, pack, run_streamed
from corectl.ansible.runner import accelerator_env
from corectl.bootstrap import endpoint, key_path, public_key
from corectl.errors import CorectlError
from corectl.secrets import SecretFiles, vault_password
from corectl.site import Site
from corectl.site.model import Cluster, Control

NODE_KEY_NAME = "corectl-node-key.pub"  # in the job's inventory/site/: the agent holds its private half


@functools.cache
def _ansible_plugins() -> None:
    """Ansible's plugin loader, set up once per process (a second set-up warns)."""
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader()


def targets(site: Site, limit: str | None) -> list[str]:
    """The nodes a run reaches: the inventory's hosts, narrowed by ``limit`` as Ansible does."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    _ansible_plugins()
    inventory = InventoryManager(loader=DataLoader(), sources=[str(site.hosts_file)])
    if limit:
        inventory.subset(limit)
    names = [host.name for host in inventory.get_hosts("all")]
    if not names:
        raise CorectlError(f"--limit {limit}: matches no node of {site.hosts_file}", exit_code=2)
    return names


@dataclass(frozen=True)
class NodeKey:
    """The site's node key as runner jobs use it: its path here (also for SSH to the runners),
    its private half (into each job's ssh-agent) and its public half (in each job's inventory)."""

    path: Path
    private: str
    public: str


def node_key(site: Site, cluster: Cluster) -> NodeKey:
    path = key_path(site, cluster, "runners take that key to the nodes")
    try:
        private = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CorectlError(f"{path}: cannot read the node key ({exc.strerror})", exit_code=2) from None
    return NodeKey(path, private, public_key(site, cluster))


@dataclass
class _Job:
    """What one shard needs beyond the request and its live run (id, folder, cancel, events)."""

    site: Site
    cluster: Cluster
    control: Control
    live: Live
    digest: str
    password: str | None
    key: NodeKey
    accelerator: dict[str, str] | None = None
    active: dict[str, tuple[Popen[bytes], PurePosixPath, shards.Shard]] = field(default_factory=dict)
    guard: threading.Lock = field(default_factory=threading.Lock)


def _adapt(job: _Job, kwargs: dict[str, Any], pack_dir: Path, remote: PurePosixPath) -> None:
    """The runner's view: the node key through ssh-agent, and (node_endpoint: address) the nodes
    at their cluster addresses, their host keys copied from the site's known_hosts entries."""
    site_dir = pack_dir / "inventory" / "site"
    (site_dir / NODE_KEY_NAME).write_text(job.key.public + "\n", encoding="utf-8")
    kwargs["ssh_key"] = job.key.private
    extravars = kwargs.setdefault("extravars", {})
    extravars["ansible_ssh_private_key_file"] = str(remote / "inventory" / "site" / NODE_KEY_NAME)
    if job.control.node_endpoint == "address":
        port = job.cluster.config.cluster.ssh.port
        extravars["ansible_host"] = "{{ corectl_address }}"
        extravars["ansible_port"] = port
        known = site_dir / "known_hosts"
        lines = known.read_text(encoding="utf-8").splitlines() if known.is_file() else []
        keys = {line.split()[0]: line.split(maxsplit=1)[1] for line in lines if len(line.split()) >= 3}
        for node in job.cluster.nodes:
            if endpoint(node) in keys:
                name = node.address if port == 22 else f"[{node.address}]:{port}"
                lines.append(f"{name} {keys[endpoint(node)]}")
        known.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _outcome(shard: shards.Shard, status: str, elapsed: float, error: str) -> ShardOutcome:
    hosts, groups = list(shard.hosts), list(shard.groups)
    return ShardOutcome(shard.name, shard.runner.name, hosts, status, elapsed, error, groups)


def runner_accelerator() -> dict[str, str] | None:
    """CORECTL_ACCELERATOR's settings for jobs on the runners (Mitogen is in their bootstrap; the
    strategy is in the project's collection, which every job carries)."""
    here = accelerator_env()
    return here if "ANSIBLE_STRATEGY" in here else None


def _run_shard(job: _Job, request: RunRequest, shard: shards.Shard) -> ShardOutcome:
    started, live = time.monotonic(), job.live
    if live.cancel():
        return _outcome(shard, "canceled", 0.0, "not started")
    control, site = job.control, job.site
    remote = PurePosixPath(control.worker_dir) / f"corectl-job-{live.ident}-{shard.name}"
    facts = PurePosixPath(control.runner_dir) / "facts" / site.name
    side = RunnerSide(remote_dir=remote, fact_cache=facts, accelerator=job.accelerator)
    shard_dir = live.run_dir / "shards" / shard.name
    shard_dir.mkdir(parents=True, exist_ok=True)

    def on_start(worker: Popen[bytes]) -> None:
        with job.guard:
            job.active[shard.name] = (worker, remote, shard)

    with tempfile.TemporaryDirectory(prefix="corectl-pack-") as tmp:
        pack_dir = Path(tmp) / "job"
        kwargs = pack(replace(request, limit=",".join(shard.hosts)), pack_dir, live.ident, side, job.password)
        _adapt(job, kwargs, pack_dir, remote)
        command = runnerhost.worker_command(control.runner_dir, remote, job.digest)
        argv = runnerhost.ssh_argv(site, shard.runner, job.key.path, command)
        done = run_streamed(kwargs, argv, shard_dir, live.tagged(shard.name), on_start, consume=True)
    with job.guard:
        job.active.pop(shard.name, None)
    elapsed = time.monotonic() - started
    if live.cancel():
        return _outcome(shard, "canceled", elapsed, "canceled")
    error = ""
    if done.status not in ("successful", "failed"):  # the job broke off: SSH's or the runner's own last word
        error = done.said[-1] if done.said else f"worker exit {done.worker_rc}"
    return _outcome(shard, done.status, elapsed, error)


def _stop_all(job: _Job) -> None:
    """Close every shard's SSH and have its runner stop the job and remove the job's directory."""
    with job.guard:
        active: list[runnerhost.Job] = [(w, remote, shard.runner, ()) for w, remote, shard in job.active.values()]
    runnerhost.stop_jobs(job.site, job.key.path, active)


def _run_phase(job: _Job, request: RunRequest, phase: list[shards.Shard]) -> list[ShardOutcome]:
    """Different runners side by side; one runner's shards one after another."""
    by_runner: dict[str, list[shards.Shard]] = {}
    for shard in phase:
        by_runner.setdefault(shard.runner.name, []).append(shard)
    outcomes: dict[str, ShardOutcome] = {}

    def work(queue: list[shards.Shard]) -> None:
        for shard in queue:
            try:
                outcomes[shard.name] = _run_shard(job, request, shard)
            except (OSError, CorectlError) as exc:  # packing or starting the job here failed
                outcomes[shard.name] = _outcome(shard, "error", 0.0, str(exc))

    threads = [threading.Thread(target=work, args=(queue,), daemon=True) for queue in by_runner.values()]
    for thread in threads:
        thread.start()
    stopped = False
    while any(thread.is_alive() for thread in threads):
        for thread in threads:
            thread.join(timeout=0.2)
        if job.live.cancel() and not stopped:
            stopped = True
            _stop_all(job)
    return [outcomes[shard.name] for shard in phase]


def run_fanned(request: RunRequest, cluster: Cluster, sink: EventSink | None = None) -> RunResult:
    """Run ``request`` shard by shard on the site's runner hosts; one RunResult, one run record."""
    site, control = request.site, cluster.config.control
    if control is None:
        raise CorectlError(f"{site.cluster_file}: no control.runners to fan the run out to")
    plan = shards.plan(cluster, targets(site, request.limit), control)
    password = vault_password(SecretFiles(site)).decode() if request.secrets else None
    key = node_key(site, cluster)  # before any shard starts: a missing key is one error, not one per shard
    accelerator = runner_accelerator()

    def transport(live: Live) -> Ended:
        job = _Job(site, cluster, control, live, runnerhost.stamp(), password, key, accelerator)
        outcomes: list[ShardOutcome] = []
        for phase in (1, 2):
            outcomes += _run_phase(job, request, [s for s in plan if s.phase == phase])
        return Ended.of_parts(outcomes)

    return lifecycle.run(request, transport, sink)
