"""One playbook run on this host through ansible-runner: how it is set up, watched and recorded
(corectl.ansible.run decides between it and a fanned-out run)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from corectl.ansible import lifecycle
from corectl.ansible.events import EventSink, RunRequest, RunResult
from corectl.ansible.lifecycle import Ended, Live
from corectl.ansible.records import accounting_has_run, site_has_run
from corectl.errors import CorectlError
from corectl.secrets import SecretFiles, vault_password_client
from corectl.site import Site


def default_forks() -> int:
    """Ansible forks wait on the network far more than on the CPU: ten per core, 5 to 100."""
    return max(5, min(100, (os.cpu_count() or 2) * 10))


ACCELERATORS = ("none", "mitogen")
MITOGEN_STRATEGY = "corectl.fleet.mitogen_linear"


def accelerator_env(name: str | None = None) -> dict[str, str]:
    """Ansible settings for CORECTL_ACCELERATOR: none (ansible.cfg's corectl.fleet.linear: Ansible's
    linear strategy, with Jinja's plugins loaded before the workers fork) or mitogen.

    Mitogen keeps one Python interpreter per node for the whole run instead of starting one per
    task; it is opt-in because it hooks into strategy plugins that ansible-core has deprecated.
    """
    name = (name if name is not None else os.environ.get("CORECTL_ACCELERATOR", "")) or "none"
    if name not in ACCELERATORS:
        raise CorectlError(f"CORECTL_ACCELERATOR={name}: unknown accelerator (one of: {', '.join(ACCELERATORS)})")
    if name == "none":
        return {}
    if importlib.util.find_spec("ansible_mitogen") is None:
        raise CorectlError(
            "CORECTL_ACCELERATOR=mitogen: mitogen is not installed beside corectl (pip install 'corectl[mitogen]')"
        )
    # Mitogen's mitogen_linear with its per-task collection scan made once per run: the
    # project's collection (collections_path in ansible.cfg, carried by fanned jobs).
    return {"ANSIBLE_STRATEGY": MITOGEN_STRATEGY}


def site_fact_cache(site: Site) -> dict[str, str]:
    """ansible-runner's settings for the site's own fact cache (.facts): every run from this host uses it, since
    the project's ansible.cfg sets none (a shared one would mix sites' hosts of the same name)."""
    return {"fact_cache_type": "jsonfile", "fact_cache": str(site.facts_dir)}


def fact_cache(request: RunRequest, private_dir: Path) -> dict[str, str]:
    """The site's fact cache; a read-only command's run gets one of its own in its private directory, since
    Ansible writes a host's cache file even for a run that gathers nothing (the Python it discovered there)."""
    if request.record:
        return site_fact_cache(request.site)
    return {"fact_cache_type": "jsonfile", "fact_cache": str(private_dir / "facts")}


def shared_inventory(private_dir: Path, root: Path) -> Path:
    """An empty inventory whose group_vars/ is the project's shared group_vars/.

    Ansible reads group_vars/ beside each inventory source and later sources win, so passing
    this one first and the site's hosts.yml second layers: role defaults < shared group_vars/
    < inventories/<site>/group_vars/ < inventories/<site>/host_vars/.
    """
    directory = private_dir / "shared"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "hosts.yml").write_text("all: {}\n", encoding="utf-8")
    (directory / "group_vars").symlink_to(root / "group_vars", target_is_directory=True)
    return directory / "hosts.yml"


def ssh_extra_args(known_hosts: Path | str) -> str:
    """Host keys are always checked, against the site's own known_hosts file."""
    return shlex.join(["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"])


def playbook_options(request: RunRequest, site_file: str | None, secrets_file: str | None) -> list[str]:
    """ansible-playbook's options of a run: its extra-vars files, then --check/--diff.

    ``site_file`` is cluster.yml's site-wide settings (corectl render's site.json): plain data,
    read once per run; neither in hosts.yml (ansible-inventory repeats all.vars under every
    host) nor a lookup (templated anew at every reference, 2-6 ms each). ``secrets_file`` is the
    site's vault-encrypted secrets.yml, given only when the run gets the vault password.
    """
    options = []
    for path in (site_file, secrets_file):
        if path is not None:
            options += ["--extra-vars", f"@{path}"]
    if request.check:
        options.append("--check")
    if request.diff:
        options.append("--diff")
    return options


def control_path_dir(site: Site) -> Path:
    """SSH ControlPersist sockets, one short directory per site (socket paths must stay short)."""
    digest = hashlib.sha1(str(site.directory).encode(), usedforsecurity=False).hexdigest()[:10]
    return Path.home() / ".ansible" / "cp" / f"corectl-{digest}"


GUARD = """\
#!{python}
# corectl: ansible-playbook, guarded so that it never outlives this run's corectl (corectl.ansible.guard)
import sys
sys.path.insert(0, {package_root!r})
from corectl.ansible.guard import main
main({parent}, {real!r})
"""


def playbook_guard(private_dir: Path) -> Path:
    """A directory whose `ansible-playbook` is corectl.ansible.guard in front of the real one.

    Put first on PATH, it is what ansible-runner runs: Ansible and everything it started end
    when this corectl process ends, however it ends (SIGKILL included).
    """
    directory = private_dir / "bin"
    directory.mkdir(parents=True, exist_ok=True)
    real = Path(sys.executable).parent / "ansible-playbook"
    if not real.is_file():
        real = Path(shutil.which("ansible-playbook") or real)
    script = directory / "ansible-playbook"
    package_root = str(Path(__file__).resolve().parents[2])
    text = GUARD.format(python=sys.executable, package_root=package_root, parent=os.getpid(), real=str(real))
    script.write_text(text, encoding="utf-8")
    script.chmod(0o700)
    return directory


def runner_kwargs(request: RunRequest, private_dir: Path, vault_password_file: Path | None = None) -> dict[str, Any]:
    """Everything handed to ansible_runner.run, minus where its artifacts go and the callbacks (unit-tested)."""
    site = request.site
    secrets_file = SecretFiles(site).variables
    cmdline = playbook_options(
        request,
        str(site.site_file) if site.site_file.is_file() else None,
        str(secrets_file) if vault_password_file is not None and secrets_file.is_file() else None,
    )
    kwargs: dict[str, Any] = {
        "private_data_dir": str(private_dir),
        "project_dir": str(site.root),
        "playbook": str(site.root / "playbooks" / request.playbook),
        "inventory": [str(shared_inventory(private_dir, site.root)), str(site.hosts_file)],
        **fact_cache(request, private_dir),
        "forks": default_forks(),
        "quiet": True,
        "envvars": {
            "ANSIBLE_CONFIG": str(site.root / "ansible.cfg"),
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_SSH_EXTRA_ARGS": ssh_extra_args(site.known_hosts),
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_path_dir(site)),
            "ANSIBLE_FORCE_COLOR": "False",
            "PATH": _path_with_ansible(playbook_guard(private_dir)),
            **accelerator_env(),
        },
    }
    if vault_password_file is not None:
        kwargs["envvars"]["ANSIBLE_VAULT_PASSWORD_FILE"] = str(vault_password_file)
    if cmdline:
        kwargs["cmdline"] = shlex.join(cmdline)
    kwargs.update(selection(request, request.extravars))
    return kwargs


def selection(request: RunRequest, extravars: dict[str, Any]) -> dict[str, Any]:
    """ansible-runner's limit, tags and extra vars of a run, each only when given. A run of site.yml also says
    whether the site has run before (role slurm keeps slurmctld stopped on an empty state directory then), and its
    accounting (slurmdbd is kept stopped on an empty database then)."""
    extravars = dict(extravars)
    if request.playbook == "site.yml":
        extravars.setdefault("corectl_site_has_run", site_has_run(request.site))
        extravars.setdefault("corectl_accounting_has_run", accounting_has_run(request.site))
    chosen: dict[str, Any] = {"limit": request.limit, "tags": request.tags, "extravars": extravars}
    return {key: value for key, value in chosen.items() if value}


# What of corectl's own environment ansible-playbook gets (ansible-runner records it in each
# run's `command` file): never a secret such as CORECTL_VAULT_PASSWORD or a bootstrap password.
ENV_KEPT = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "COLORTERM",
        "XDG_CACHE_HOME", "COLUMNS", "LINES", "NO_COLOR", "SSH_AUTH_SOCK", "VIRTUAL_ENV", "DOCKER_HOST",
        "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
    }
)  # fmt: skip
ENV_KEPT_PREFIXES = ("LC_", "ANSIBLE_", "MITOGEN_")


def runner_environ(environ: dict[str, str]) -> dict[str, str]:
    """The allow-listed part of ``environ``: locale, paths, proxies and Ansible's own settings."""
    return {k: v for k, v in environ.items() if k in ENV_KEPT or k.startswith(ENV_KEPT_PREFIXES)}


@contextmanager
def _runner_environ() -> Iterator[None]:
    """ansible-runner seeds a run's environment from os.environ: show it only the allowed part."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(runner_environ(saved))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


Build = Callable[[Path, ExitStack], dict[str, Any]]


def here(live: Live, build: Build, artifact_dir: Path, ident: str, on_event: EventSink) -> Ended:
    """A run's jobs on this host: one ansible-runner run (its own private directory, our cancel), its artifacts in
    ``artifact_dir``/``ident``, its events to ``on_event``."""
    import ansible_runner  # heavy import, only when a run happens

    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="corectl-run-"))
        kwargs = build(Path(tmp), stack)
        # ansible-runner's rotation would remove runs in progress: corectl.ansible.records.prune_runs
        kwargs.update(artifact_dir=str(artifact_dir), ident=ident, rotate_artifacts=0)

        def keep(event: dict[str, Any]) -> bool:
            on_event(event)
            return True  # keep the event: ansible-runner drops it (and the stats) otherwise

        with _runner_environ():
            result = ansible_runner.run(**kwargs, event_handler=keep, cancel_callback=live.cancel)
    return Ended(str(result.status), int(result.rc if result.rc is not None else 1))


def whole_here(build: Build) -> lifecycle.Transport:
    """The transport of a run wholly on this host: one ansible-runner run, its artifacts the run's own folder."""
    return lambda live: here(live, build, live.run_dir.parent, live.ident, live)


def site_build(request: RunRequest) -> Build:
    """How a run of the site's own playbooks is built here: its fact cache and known_hosts there, the vault
    password through corectl's socket when the run gets secrets."""
    site = request.site
    if request.record:  # a read-only command's run creates neither (no fact is gathered, no host key added)
        site.facts_dir.mkdir(parents=True, exist_ok=True)
        site.known_hosts.touch(exist_ok=True)

    def build(private_dir: Path, stack: ExitStack) -> dict[str, Any]:
        vault_file = stack.enter_context(vault_password_client(site, private_dir)) if request.secrets else None
        return runner_kwargs(request, private_dir, vault_file)

    return build


def run_playbook(request: RunRequest, sink: EventSink | None = None) -> RunResult:
    """Run a playbook of the project on the site from this host; ``sink`` sees every event (live progress)."""
    return lifecycle.run(request, whole_here(site_build(request)), sink)


def run_standalone(
    playbook: Path, inventory: dict[str, Any], extravars: dict[str, Any], site: Site, command: str
) -> RunResult:
    """Run a playbook outside the site inventory (the lab's infrastructure containers)."""
    request = RunRequest(site=site, playbook=str(playbook), command=command, secrets=False)

    def build(private_dir: Path, _stack: ExitStack) -> dict[str, Any]:
        return {
            "private_data_dir": str(private_dir),
            "project_dir": str(site.root),
            "playbook": str(playbook),
            "inventory": inventory,
            "extravars": extravars,
            **site_fact_cache(site),
            "quiet": True,
            "envvars": {
                "ANSIBLE_CONFIG": str(site.root / "ansible.cfg"),
                "PATH": _path_with_ansible(playbook_guard(private_dir)),
            },
        }

    return lifecycle.run(request, whole_here(build))


def _path_with_ansible(guard: Path) -> str:
    """The guard's ansible-playbook first, then corectl's Python environment (on PATH or not)."""
    return os.pathsep.join([str(guard), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
