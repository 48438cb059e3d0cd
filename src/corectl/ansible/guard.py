"""The `ansible-playbook` that corectl puts first on ansible-runner's PATH: Ansible, and every
process it started, never outlives the corectl that ran it.

ansible-runner starts ansible-playbook on a pty with SIGHUP ignored, so a corectl killed with
SIGKILL (or by the OOM killer) would leave Ansible changing nodes outside the site lock, and
Ansible's own signal handling stops its workers but not the commands they run (a `sleep` task
outlives it). Two small processes stand between ansible-runner and Ansible:

  relay (what ansible-runner started)   dies with corectl (PR_SET_PDEATHSIG: SIGKILL) or with
                                        ansible-runner's cancel (SIGKILL to its process group);
                                        passes SIGINT on to the supervisor
  supervisor (the relay's child, in a   dies with the relay (PR_SET_PDEATHSIG: SIGTERM) by
  process group of its own)             stopping the whole tree below it: SIGTERM, then SIGKILL
                                        after GRACE seconds; a child subreaper, so processes
                                        whose parent died stay in that tree
  ansible-playbook (the supervisor's child), its workers, their commands and SSH clients

When ansible-playbook ends, whatever it left running below it is stopped the same way (a canceled
run's workers and their commands; a run that ended normally leaves nothing), and the relay exits
with ansible-playbook's exit code.
Linux only (prctl); elsewhere the relay runs ansible-playbook without the guard.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE = 5.0


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (AttributeError, OSError):
        return False


def _exit_code(status: int) -> int:
    """A shell's exit code for a wait status: the code, or 128 + the signal that ended it."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def descendants(root: int) -> list[int]:
    """Live (not zombie) processes below ``root``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _reap() -> None:
    """Collect exited children (a subreaper adopts orphans: they are ours to wait for)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def stop_tree(grace: float = GRACE) -> None:
    """SIGTERM to every process below this one, SIGKILL to those left after ``grace`` seconds."""
    me = os.getpid()
    _signal_all(descendants(me), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap()
        if not descendants(me):
            return
        time.sleep(0.1)
    _signal_all(descendants(me), signal.SIGKILL)
    _reap()


def _supervise(relay: int, argv: list[str]) -> int:
    """The supervisor: run ansible-playbook, stop the whole tree when the relay dies."""
    # a process group of its own: ansible-runner cancels a run with SIGKILL to the relay's group,
    # which would take the supervisor along before it could stop Ansible's workers (each in a
    # session of its own) and the commands they run
    os.setpgid(0, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)

    def relay_died(_signum: int, _frame: FrameType | None) -> None:
        stop_tree()
        os._exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, relay_died)
    if not _prctl(PR_SET_PDEATHSIG, signal.SIGTERM) or os.getppid() != relay:
        relay_died(signal.SIGTERM, None)  # the relay is gone already
    playbook = subprocess.Popen(argv)
    signal.signal(signal.SIGINT, lambda signum, _frame: playbook.send_signal(signum))
    code = _exit_code(os.waitpid(playbook.pid, 0)[1])
    stop_tree()  # what ansible-playbook left behind (a canceled run's workers and their commands)
    return code


def main(parent: int, real: str) -> None:
    """The relay: ansible-runner's child. ``parent`` is corectl's pid, ``real`` ansible-playbook."""
    argv = [real, *sys.argv[1:]]
    if not _prctl(PR_SET_PDEATHSIG, signal.SIGKILL):
        os.execv(real, argv)  # no prctl here: run Ansible unguarded
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)  # corectl died before the guard was armed
    relay = os.getpid()
    supervisor = os.fork()
    if supervisor == 0:
        code = 1
        try:
            code = _supervise(relay, argv)
        finally:
            os._exit(code)
    signal.signal(signal.SIGINT, lambda signum, _frame: os.kill(supervisor, signum))
    sys.exit(_exit_code(os.waitpid(supervisor, 0)[1]))
