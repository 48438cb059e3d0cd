"""runners bootstrap: put the control host's Ansible onto the runner hosts of cluster.yml."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import PurePosixPath

import paramiko
from rich.console import Console

from corectl.ansible.remote import runnerhost
from corectl.ansible.remote.fanout import node_key
from corectl.bootstrap import fingerprint, known_key, record_key
from corectl.errors import CorectlError
from corectl.site import Site
from corectl.site.inventory import validate
from corectl.site.model_services import RunnerHost


def _learn_host_key(site: Site, runner: RunnerHost) -> str | None:
    """First contact records the runner's host key (as `corectl bootstrap` does for nodes); a
    changed key is refused. Returns the fingerprint when it was recorded now."""
    name = runner.host if runner.port == 22 else f"[{runner.host}]:{runner.port}"
    try:
        transport = paramiko.Transport((runner.host, runner.port))
        transport.start_client(timeout=runnerhost.CONNECT_TIMEOUT)
        key = transport.get_remote_server_key()
        transport.close()
    except (OSError, paramiko.SSHException) as exc:
        raise CorectlError(f"runner {runner.name}: cannot reach {name}: {exc}") from None
    recorded = known_key(site.known_hosts, name)
    if recorded == (key.get_name(), key.get_base64()):
        return None
    shown = f"{key.get_name()} {fingerprint(key)}"
    if recorded is not None:
        raise CorectlError(
            f"runner {runner.name}: the host key of {name} ({shown}) differs from the one in {site.known_hosts}; "
            "refusing to connect (remove the old entry only if the runner was reinstalled)"
        )
    record_key(site.known_hosts, name, key)
    return shown


def bootstrap_runners(site: Site, console: Console) -> None:
    cluster = validate(site)
    control = cluster.config.control
    if control is None:
        raise CorectlError(f"{site.cluster_file}: no control.runners section; nothing to bootstrap", exit_code=2)
    key = node_key(site, cluster).path
    digest = runnerhost.stamp()
    data = runnerhost.payload(PurePosixPath(control.runner_dir))
    for runner in control.runners:  # one at a time: known_hosts is one file
        shown = _learn_host_key(site, runner)
        if shown:
            console.print(f"runner {runner.name}: host key {shown} recorded in {site.known_hosts}", highlight=False)
    script = runnerhost.install_script(control.runner_dir, digest)
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = pool.map(lambda r: runnerhost.run_on(site, r, key, script, data), control.runners)
        list(results)
    pins = {dist.metadata["Name"]: dist.version for dist in runnerhost.closure()}
    what = f"ansible-core {pins['ansible-core']}, ansible-runner {pins['ansible-runner']}"
    for runner in control.runners:
        console.print(f"runner {runner.name}: {what} in {control.runner_dir} (stamp {digest})", highlight=False)
