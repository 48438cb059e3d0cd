"""A run as corectl sees it: what was asked (RunRequest), what came of it (RunResult, per host, per shard),
and what its events say, classified once (outcome, Tally, reported_change, failure_detail, changed_paths) and what
its playbooks hand back (Returned), for the lifecycle that records a run and the live progress that shows it."""

from __future__ import annotations

import os
import re
import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corectl.site import Site

# characters of a host's first failure kept in the run record and shown (a held head's reasons and what to do: ~500)
MESSAGE_LIMIT = 600

if TYPE_CHECKING:
    from corectl.site.context import Context

EventSink = Callable[[dict[str, Any]], None]
SHARD_KEY = "corectl_shard"  # added to the events of a fanned-out run: the shard they came from


def converged_the_site(playbook: str | None, status: str | None, check: bool | None) -> bool:
    """A run that converged the site: of site.yml (provision, add-node), successful, not a plan (check mode)."""
    return playbook == "site.yml" and status == "successful" and not check


@dataclass(frozen=True)
class RunRequest:
    """What to run: a playbook of the project against a site, plus the operator's options."""

    site: Site
    playbook: str = "site.yml"
    command: str = "provision"
    limit: str | None = None
    tags: str | None = None
    check: bool = False
    diff: bool = False
    extravars: dict[str, Any] = field(default_factory=dict)
    secrets: bool = True  # hand ansible the site's vault password and secrets.yml
    # over the site's runner hosts where cluster.yml names them (control.runners), else here;
    # False: always from this host (one host's work, such as a read on the controller)
    fan_out: bool = True
    # False: a read-only command's run (corectl.site.context), which leaves no run record in the site and is
    # never fanned out; its ansible-runner artifacts live in a temporary directory for the run's length
    record: bool = True

    @classmethod
    def of(cls, ctx: Context, **fields: Any) -> RunRequest:
        """A run of the command ``ctx`` is: of its site, recorded unless the command only reads."""
        return cls(site=ctx.site, record=ctx.writes, **fields)


@dataclass
class HostStats:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0


@dataclass
class ShardOutcome:
    """One shard of a fanned-out run (corectl.ansible.remote.fanout): where it ran and how it ended."""

    name: str
    runner: str
    hosts: list[str]
    status: str
    elapsed: float
    error: str = ""  # why it did not finish: the runner unreachable, stale, gone mid-run, canceled
    groups: list[str] = field(default_factory=list)  # the leaves or racks it held (corectl.ansible.remote.shards)
    control_cpu_s: float | None = None  # a part run from this host: the control host's CPU for it (CpuClock)


@dataclass
class RunResult:
    status: str
    rc: int
    hosts: dict[str, HostStats]
    artifact_dir: Path
    elapsed: float
    # host -> what Ansible said when the host failed or could not be reached (first message)
    messages: dict[str, str] = field(default_factory=dict)
    tasks: int = 0  # tasks the playbook started (playbook_on_task_start): a later run's expected total
    shards: list[ShardOutcome] = field(default_factory=list)  # a fanned-out run's, in run order
    # the control host's CPU seconds for the run: corectl's own process and the processes it started and waited
    # for (ansible-playbook and its forks, SSH to runners or nodes)
    cpu: dict[str, float] = field(default_factory=dict)
    recorded: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> what the playbook handed back

    @property
    def failed_hosts(self) -> list[str]:
        return sorted(h for h, s in self.hosts.items() if s.failed or s.unreachable)

    def failure_lines(self) -> list[str]:
        """One line per failed or unreachable host, with what Ansible said."""
        lines = []
        for host in self.failed_hosts:
            kind = "unreachable" if self.hosts[host].unreachable else "failed"
            lines.append(f"{kind} {host}: {self.messages.get(host, '')}".rstrip(": "))
        return lines

    def output_tail(self, lines: int = 5) -> list[str]:
        """The last lines Ansible printed (for runs that failed before any host ran)."""
        text = ""
        for name in ("stdout", "stderr"):
            path = self.artifact_dir / name
            if path.is_file():
                text += path.read_text(encoding="utf-8", errors="replace")
        text = _ANSI.sub("", text)  # Ansible colours its output even into files
        return [line for line in text.splitlines() if line.strip()][-lines:]

    @property
    def changed(self) -> int:
        return sum(s.changed for s in self.hosts.values())

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0 and not self.failed_hosts


VERBOSITY_ENV = "ANSIBLE_VERBOSITY"  # Ansible's own setting; `corectl -v` sets it (corectl.cli.app)


def verbosity() -> int:
    """How verbose Ansible is asked to be (ANSIBLE_VERBOSITY, 0-6; 0 when unset or not a number). Runs from
    here inherit it with the rest of Ansible's settings; jobs sent to runner hosts and nodes carry it."""
    value = os.environ.get(VERBOSITY_ENV, "").strip()
    return min(6, int(value)) if value.isdigit() else 0


def stats_from_event(event_data: dict[str, Any]) -> dict[str, HostStats]:
    """Per-host numbers from a playbook_on_stats event (failures + dark = failed/unreachable)."""
    keys = {
        "ok": "ok",
        "changed": "changed",
        "failures": "failed",
        "dark": "unreachable",
        "skipped": "skipped",
        "rescued": "rescued",
        "ignored": "ignored",
    }
    hosts: dict[str, HostStats] = {}
    for source, target in keys.items():
        for host, count in (event_data.get(source) or {}).items():
            setattr(hosts.setdefault(host, HostStats()), target, int(count))
    return hosts


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def reported_change(event: dict[str, Any]) -> bool:
    """Whether a task result event reports a change. A no_log result is censored down to a
    notice (no "changed" key); Ansible's own "changed: [host]" line still says it."""
    res = (event.get("event_data") or {}).get("res") or {}
    if "changed" in res:
        return bool(res["changed"])
    return _ANSI.sub("", str(event.get("stdout", ""))).startswith("changed: [")


def changed_paths(event_data: dict[str, Any]) -> list[str]:
    """The paths a corectl.fleet.files result changed (one task writes a role's files); [] for
    any other task."""
    return list(((event_data.get("res") or {}).get("changed_paths")) or [])


def failure_detail(event_data: dict[str, Any], unreachable: bool) -> str:
    """The line that says why a task failed (its first) or why a host was unreachable (SSH says
    it last: "Host key verification failed.", "Connection refused"); banner lines dropped. A command that
    exited non-zero adds its exit status and the last line of its stderr ("non-zero return code" alone says nothing)."""
    res = event_data.get("res") or {}
    text = str(res.get("msg") or res.get("stderr") or ("unreachable" if unreachable else "failed"))
    lines = _lines(text)
    if not lines:
        return "unreachable" if unreachable else "failed"
    said = _lines(str(res.get("stderr") or ""))  # (stderr only: what a command prints of its work stays there)
    if lines[0] == COMMAND_FAILED and said:
        return f"{COMMAND_FAILED} {res.get('rc', '?')}: {said[-1]}"
    return lines[-1] if unreachable else lines[0]


COMMAND_FAILED = "non-zero return code"  # ansible.builtin.command's msg when the command exits non-zero


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().strip("@")]


FAILURES = ("failed", "unreachable")


def outcome(event: dict[str, Any]) -> str | None:
    """What a task result says of its host: ok, changed, skipped, failed, unreachable, or ignored
    (a failure under ignore_errors); None for any other event (starts, loop items, plays)."""
    kind = event.get("event")
    if kind == "runner_on_ok":
        return "changed" if reported_change(event) else "ok"
    if kind == "runner_on_failed":
        return "ignored" if (event.get("event_data") or {}).get("ignore_errors") else "failed"
    return {"runner_on_skipped": "skipped", "runner_on_unreachable": "unreachable"}.get(str(kind))


# What a playbook hands back for the run record (set_stats, like Returned's keys): per host, a mapping such as
# {"packages": [{"name", "before", "after"}]} (playbooks/upgrade-os.yml); the record keeps it, `runs --show` shows it.
RECORD_KEY = "corectl_record"


class Tally:
    """Per-host counts taken from the task events as they come.

    Ansible's own totals (playbook_on_stats) arrive only when a playbook ends; a canceled or
    killed run never sends them, so its summary is built from these instead.
    """

    def __init__(self) -> None:
        self.hosts: dict[str, HostStats] = {}
        self.finals: dict[str, HostStats] = {}  # Ansible's own totals, from each playbook_on_stats
        self.messages: dict[str, str] = {}
        self.tasks = 0
        self.recorded: dict[str, dict[str, Any]] = {}  # host -> what the playbook handed back for the record

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("event") == "playbook_on_task_start":
            self.tasks += 1
        if event.get("event") == "playbook_on_stats":
            self.finals.update(stats_from_event(event.get("event_data", {})))
            handed = ((event.get("event_data") or {}).get("artifact_data") or {}).get(RECORD_KEY)
            if isinstance(handed, dict):
                self.recorded.update({str(host): value for host, value in handed.items() if isinstance(value, dict)})
        data = event.get("event_data") or {}
        host, result = data.get("host"), outcome(event)
        if not host or result is None:
            return
        stats = self.hosts.setdefault(host, HostStats())
        if result == "changed":
            stats.ok += 1
        setattr(stats, result, getattr(stats, result) + 1)
        if result in FAILURES and host not in self.messages:
            detail = failure_detail(data, unreachable=result == "unreachable")
            self.messages[host] = f"{data.get('task', '')}: {detail}"[:MESSAGE_LIMIT]


# What of an event a run's Tally, a Returned, the live display and plan's list of changes read: the task result's
# host, task and role, the play's name, whether a failure was ignored, and of the result itself whether it changed
# something (and which files, corectl.fleet.files) and, for a failure or a warning, what was said. A playbook's
# totals (playbook_on_stats) are kept whole.
_DATA_READ = ("host", "task", "name", "play", "role", "ignore_errors")
_RES_READ = ("msg", "stderr", "rc", "warnings")


def slim(event: dict[str, Any], verbose: int | None = None) -> dict[str, Any]:
    """What of ``event`` the run's tally and display read (see above), for an event that crosses from one process
    to another (corectl.ansible.remote.followers): a task result's module output can be a node's whole facts, and the
    whole event is kept in its job's events file anyway. The same Tally, Returned and live display result from
    either. ``verbose``: verbosity(), read once by a caller that slims many events."""
    data = event.get("event_data") or {}
    if event.get("event") == "playbook_on_stats":
        kept = dict(data)
    else:
        kept = {k: data[k] for k in _DATA_READ if k in data}
        res = data.get("res")
        if isinstance(res, dict):
            said = outcome(event) in (*FAILURES, "ignored") or res.get("warnings")
            changed = reported_change(event)
            kept["res"] = {
                "changed": changed,
                **({k: res[k] for k in _RES_READ if k in res} if said else {}),
                **({"changed_paths": res["changed_paths"]} if changed and "changed_paths" in res else {}),
            }
    small: dict[str, Any] = {k: event[k] for k in ("event", SHARD_KEY) if k in event}
    small["event_data"] = kept
    if "stdout" in event and (verbosity() if verbose is None else verbose) > 0:  # Ansible's output (corectl -v)
        small["stdout"] = event["stdout"]
    return small


# Events that neither a run's Tally, a Returned, the live display nor plan's list of changes read: a task's start on
# a host (the host counts as seen with its result), Ansible's verbose and deprecation lines, its warnings (a task
# result's own warnings are in the result), plays without hosts and includes. Printed only with corectl -v.
UNREAD = frozenset(
    ("runner_on_start", "verbose", "deprecated", "warning", "playbook_on_no_hosts_matched", "playbook_on_include")
)


def crosses(event: dict[str, Any], verbose: int) -> bool:
    """Whether ``event`` goes from a group's process to the run's (corectl.ansible.remote.followers): all do when
    Ansible's output is shown (``verbose``, verbosity()), else those something there reads. Every event stays in its
    job's events file."""
    return verbose > 0 or event.get("event") not in UNREAD


class Returned:
    """What a playbook hands back to corectl under ``key``: the one way data comes back from a run.

    The playbook returns it with ansible.builtin.set_stats (per_host: false, the default aggregate: true), each
    host adding itself, ``data: {key: "{{ {inventory_hostname: value} }}"}``; ansible-runner delivers the merged
    mapping as the artifact data of the stats event at the end of each playbook (one per part of a fanned or
    node-local run: merged here). Hosts that could not be reached return nothing and are named in ``unreachable``.
    Events go on to ``sink``.
    """

    def __init__(self, key: str, sink: EventSink) -> None:
        self.key = key
        self.sink = sink
        self.by_host: dict[str, Any] = {}
        self.unreachable: dict[str, str] = {}  # host -> "unreachable: <first line>"

    def __call__(self, event: dict[str, Any]) -> None:
        data = event.get("event_data") or {}
        kind, host = event.get("event"), data.get("host")
        if kind == "runner_on_unreachable" and host:
            lines = str((data.get("res") or {}).get("msg") or "unreachable").strip().splitlines()
            self.unreachable[str(host)] = f"unreachable: {lines[0] if lines else ''}"
        elif kind == "playbook_on_stats":
            returned = (data.get("artifact_data") or {}).get(self.key)
            if isinstance(returned, dict):
                self.by_host.update({str(name): value for name, value in returned.items()})
        self.sink(event)


class CpuClock:
    """The control host's CPU seconds spent since it was made: this process, and its children it waited for."""

    def __init__(self) -> None:
        self.start = self._now()

    @staticmethod
    def _now() -> tuple[float, float]:
        own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime, waited.ru_utime + waited.ru_stime

    def spent(self) -> dict[str, float]:
        own, waited = self._now()
        return {"corectl": round(own - self.start[0], 2), "children": round(waited - self.start[1], 2)}
