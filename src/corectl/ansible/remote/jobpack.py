"""A run packed for ansible-runner's remote execution (`transmit` | `worker` | `process`).

Issue 15's first building block: not wired into any command yet (docs/scale.md). A packed job
is one private data directory that `transmit` streams to a runner host, where
`ansible-runner worker --private-data-dir DIR --delete` unpacks and runs it:

    project/             ansible.cfg, collections/ (corectl.fleet), playbooks/ and roles/
    inventory/shared/    an empty hosts.yml whose group_vars/ is the shared one (layered first)
    inventory/site/      the site's hosts.yml, nodes.json, switches.json, site.json, known_hosts,
                         group_vars/, host_vars/ and secrets/ (vault-encrypted, as at rest)

Every path the job names is under ``remote_dir``, the directory the worker will unpack into
(corectl chooses it; on tmpfs), never a path of the control host. The vault password is answered
to ``--ask-vault-pass`` from ansible-runner's ``passwords``: `transmit` writes those to the pack's
env/passwords (a 0700 temporary directory here, removed as soon as it is sent: ``consume``) and
the worker to its own env/passwords for the length of the job (a task of a job found the file
there; docs/scale.md), which is why ``remote_dir`` belongs on tmpfs and the worker runs with
``--delete``. A node-local job (``node``) carries that node's own secrets under a one-time
password instead (corectl.ansible.remote.nodelocal).
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from corectl.ansible.events import VERBOSITY_ENV, RunRequest, verbosity
from corectl.ansible.remote.stream import follow
from corectl.ansible.runner import default_forks, playbook_options, selection, ssh_extra_args
from corectl.secrets import SecretFiles

VAULT_PROMPT = r"^Vault password:\s*?$"
PROJECT_PARTS = ("ansible.cfg", "collections", "playbooks", "roles")
SITE_FILES = ("hosts.yml", "nodes.json", "switches.json", "site.json", "known_hosts")
SITE_DIRS = ("group_vars", "host_vars", "secrets")


@dataclass(frozen=True)
class NodeJob:
    """A node-local job's own part: the node it runs for and its secrets (file name under
    inventory/site/secrets -> contents, vault-encrypted with the job's one-time password)."""

    host: str
    secrets: dict[str, bytes]


@dataclass(frozen=True)
class RunnerSide:
    """Where the job lives and what it uses on the runner host."""

    remote_dir: PurePosixPath  # the worker's --private-data-dir (fresh per job, on tmpfs)
    fact_cache: PurePosixPath  # kept between jobs on the runner (facts of its shard's hosts)
    ssh_key: str | None = None  # the runner's own key for the nodes (else the site's setting)
    accelerator: dict[str, str] | None = None  # the Ansible settings of CORECTL_ACCELERATOR there


def _copy(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target, symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    elif source.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def host_vars(site_dir: Path, host: str, pack_dir: Path) -> None:
    """``host``'s own host_vars (a file or a directory) into the pack's site inventory."""
    for name in (host, f"{host}.yml", f"{host}.yaml", f"{host}.json"):
        _copy(site_dir / "host_vars" / name, pack_dir / "inventory" / "site" / "host_vars" / name)


def pack(
    request: RunRequest,
    pack_dir: Path,
    ident: str,
    runner: RunnerSide,
    vault_password: str | None,
    node: NodeJob | None = None,
) -> dict:
    """Fill ``pack_dir`` with the job of ``request``; return ansible-runner's kwargs for `transmit`.

    ``vault_password`` None: the job gets neither the password nor secrets.yml (as a run with
    ``request.secrets`` False). ``node``: a node-local job (corectl.ansible.remote.nodelocal): of
    the site's host_vars only that node's (none for ``host`` ""), no known_hosts, and instead of
    the site's secrets the node's own, encrypted with ``vault_password`` (that run's one-time
    password).
    """
    site, remote = request.site, runner.remote_dir
    for part in PROJECT_PARTS:
        _copy(site.root / part, pack_dir / "project" / part)
    shared = pack_dir / "inventory" / "shared"
    shared.mkdir(parents=True)
    (shared / "hosts.yml").write_text("all: {}\n", encoding="utf-8")
    _copy(site.root / "group_vars", shared / "group_vars")
    site_dir = pack_dir / "inventory" / "site"
    if node is None:
        for name in (*SITE_FILES, *SITE_DIRS):
            _copy(site.directory / name, site_dir / name)
    else:
        for name in (*SITE_FILES, *SITE_DIRS):
            if name not in ("known_hosts", "host_vars", "secrets"):
                _copy(site.directory / name, site_dir / name)
        if node.host:
            host_vars(site.directory, node.host, pack_dir)
        for name, data in node.secrets.items():
            (site_dir / "secrets").mkdir(mode=0o700, parents=True, exist_ok=True)
            (site_dir / "secrets" / name).write_bytes(data)

    local_site, remote_site = pack_dir / "inventory" / "site", remote / "inventory" / "site"
    settings = site.site_file.relative_to(site.directory)
    secrets_yml = SecretFiles(site).variables.relative_to(site.directory)
    site_file = str(remote_site / settings) if (local_site / settings).is_file() else None
    with_secrets = vault_password is not None and (local_site / secrets_yml).is_file()
    secrets_file = str(remote_site / secrets_yml) if with_secrets else None
    cmdline = ["-i", str(remote / "inventory" / "shared" / "hosts.yml"), "-i", str(remote_site / "hosts.yml")]
    cmdline += playbook_options(request, site_file, secrets_file)
    extravars: dict[str, Any] = dict(request.extravars)
    if runner.ssh_key is not None:
        extravars["ansible_ssh_private_key_file"] = runner.ssh_key
    kwargs: dict[str, Any] = {
        "private_data_dir": str(pack_dir),
        "playbook": f"playbooks/{request.playbook}",  # the worker runs it from project/
        "ident": ident,
        "fact_cache_type": "jsonfile",
        "fact_cache": str(runner.fact_cache),
        "forks": default_forks(),
        "quiet": True,
        "envvars": {
            "ANSIBLE_CONFIG": str(remote / "project" / "ansible.cfg"),
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_SSH_EXTRA_ARGS": ssh_extra_args(remote_site / "known_hosts"),
            "ANSIBLE_FORCE_COLOR": "False",
            **(runner.accelerator or {}),
            **({VERBOSITY_ENV: str(verbose)} if (verbose := verbosity()) else {}),  # corectl -v, as a run from here
        },
    }
    if vault_password is not None:
        cmdline.append("--ask-vault-pass")
        kwargs["passwords"] = {VAULT_PROMPT: vault_password}
    kwargs["cmdline"] = shlex.join(cmdline)
    kwargs.update(selection(request, extravars))
    return kwargs


def zip_message(directory: Path) -> bytes:
    """``directory`` as one `zipfile` message of ansible-runner's job stream (its header line and base64 body),
    made once for jobs that share it (send)."""
    from ansible_runner.utils.streaming import stream_dir

    with tempfile.TemporaryFile() as out:
        stream_dir(str(directory), out)  # type: ignore[arg-type]  # a binary file, as transmit's output
        out.seek(0)
        return out.read()


def send(kwargs: dict[str, Any], layers: list[bytes], output: IO[bytes]) -> None:
    """ansible-runner's `transmit` for a job whose common part was zipped ahead: the kwargs line, each of
    ``layers`` (zip_message()), then kwargs' own private_data_dir with the env/ files transmit would write there
    (cmdline, envvars, extravars, passwords), and eof. The worker unpacks each zipfile message into its directory
    in turn, so a node-local run zips the project and inventory once, not once per node."""
    from ansible_runner.utils import dump_artifacts

    kwargs = dict(kwargs)
    dump_artifacts(kwargs)  # the env/ files, taken out of kwargs, as transmit does
    directory = Path(kwargs.pop("private_data_dir"))
    output.write(json.dumps({"kwargs": kwargs}).encode() + b"\n")
    for layer in [*layers, zip_message(directory)]:
        output.write(layer)
    output.write(json.dumps({"eof": True}).encode() + b"\n")
    output.flush()


@dataclass
class Streamed:
    """How a streamed job ended: its status, 0 or 1 for ansible-playbook's exit code, the
    worker's exit code and the last lines it wrote to stderr (SSH's and the runner's own errors)."""

    status: str
    rc: int
    worker_rc: int
    said: list[str]


def run_streamed(
    kwargs: dict[str, Any],
    worker_argv: list[str],
    work_dir: Path,
    on_event: Callable[[dict[str, Any]], Any],
    on_start: Callable[[subprocess.Popen[bytes]], Any] | None = None,
    consume: bool = False,
    layers: list[bytes] | None = None,
) -> Streamed:
    """Run a packed job through a worker and follow it to its end.

    `transmit` writes straight into the worker's stdin (the stream holds the vault password, so
    it never touches the control host's disk); corectl.ansible.remote.stream.follow reads the worker's
    stdout as it comes, so ``on_event`` sees each event live, and keeps the events in ``work_dir``.
    ``worker_argv`` starts `ansible-runner worker`: here, or on a runner host through SSH.
    ``on_start`` gets the worker process (to stop it). ``consume``:
    remove the pack as soon as it is sent (transmit writes the job's passwords into its env/).
    ``layers``: the job's common part, zipped ahead (send); the pack then holds only the rest.
    """
    import ansible_runner  # heavy import, only when a run happens

    worker = subprocess.Popen(worker_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert worker.stdin is not None and worker.stdout is not None and worker.stderr is not None
    if on_start is not None:
        on_start(worker)
    said: deque[str] = deque(maxlen=5)

    def transmit() -> None:
        try:
            if layers is None:
                ansible_runner.run(**kwargs, streamer="transmit", _output=worker.stdin)
            else:
                send(kwargs, layers, worker.stdin)
        except BrokenPipeError:
            pass  # the worker went away (a runner not reachable): `process` reports it
        finally:
            with contextlib.suppress(BrokenPipeError):
                worker.stdin.close()
            if consume:
                shutil.rmtree(kwargs["private_data_dir"], ignore_errors=True)

    def listen(stream: IO[bytes]) -> None:
        for line in stream:
            text = line.decode(errors="replace").strip()
            if text:
                said.append(text)

    threads = [threading.Thread(target=transmit, daemon=True), threading.Thread(target=listen, args=(worker.stderr,))]
    for thread in threads:
        thread.start()
    explanation = ""
    try:
        followed = follow(worker.stdout, work_dir, on_event)
        status, explanation = followed.status, followed.explanation
    except Exception as exc:  # a stream cut mid-way (a runner gone) breaks the artifacts' unpacking anywhere
        status = "error"
        said.append(f"the job's stream broke off ({type(exc).__name__})")
    finally:
        worker.stdout.close()
        for thread in threads:
            thread.join()
        worker.wait()
    if explanation and not said:  # what the worker or SSH said on stderr says more (No route to host)
        said.append(explanation)
    # The stream carries the job's status, not ansible-playbook's exit code (the worker exits
    # non-zero for a failed job too). A worker that never ran (a runner not reachable) leaves the
    # stream empty, which follow reports as "error".
    return Streamed(status, 0 if status == "successful" else 1, worker.returncode, list(said))
