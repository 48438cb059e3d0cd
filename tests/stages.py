"""`make test`: every test stage in three lanes side by side, and a time table at the end.

    lane 1: the stand-in node image (Docker engine included), then the end-to-end lab suite but its
            second_lab tests (pytest -m "lab and not second_lab"), then the tail
    lane 2: lint (ruff, lint-imports, ansible-lint), the unit tests (pytest -m "not lab ..."), then
            the suite's second_lab tests on a second lab (lab-fleet; its nodes start from the baked
            image, image-baked, since the first lab proves the install from the bare one), then the tail
    lane 3: the tail from the start, each of its stages taken only while the machine has idle CPU
            (less than GATE_BUSY_PERCENT busy over the last 30 s)

The tail is one queue: the smaller end-to-end test on a Debian 13 lab of its own (lab-trixie) first,
then the molecule stages, most costly first: every scenario on Debian 12 (bookworm: molecule-<scenario>)
and on Debian 13 (trixie: molecule-<scenario>-trixie), never one scenario on both at once. A release's
image is built once, by the first lane that needs it (image, image-trixie). The labs and each molecule
scenario use their own docker network, node names (Slurm's cgroups are named after nodes) and ports, so
they can run side by side. Every stage writes its output to build/<stage>.log; a failed stage's log
tail is printed, and its first error lines again at the very end (where a reader of the last lines
looks). build/cpu.log has the machine's CPU use every 10 s, and the end says how busy it was.
Exit status 1 when any stage failed.

Why the third lane is gated: a third lane that always runs kept both cores about 93 % busy (session 27)
and only added its lab's set-up; but with two labs the cores idle 40-60 % for minutes while the labs'
tests wait for state (a backup controller's takeover, a log window, a reboot), and the tail fits there.
The suite is split over two labs because one lab was the critical path: with the whole suite on lane 1
the second core idled for the run's last ~1,000-1,800 s (session 30: 79 % busy; CI stopped the lab
stage at its 4,800 s limit), against the second lab's set-up (~300-400 CPU-s).

    python tests/stages.py [all | check | lint | unit | image | lab | lab-fleet | lab-trixie
                            | molecule [RELEASE ...] [SCENARIO ...]]

`check` is the inner loop (`make check`): lint beside the unit and integration tests (on two pytest-xdist workers).

RELEASE is bookworm or trixie (default: both). `lab-fleet` runs the suite's second_lab tests
(independent of the others' state) and its every_lab secret scan on a second lab of their own
(CORECTL_E2E_LAB=labfleet), beside anything that uses the first.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cpuacct
from corectl.lab import image
from corectl.lab.nodes import NODE_IMAGE_ENV

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
BIN = Path(sys.executable).parent
# The lab stage's limits: one test (setup included) and the whole stage. A test past its limit fails
# with a traceback of where it waited and the others go on; a stage past its limit is interrupted,
# so that CI (90 minutes at most) always ends with this script's table and the failure's log tail.
LAB_TEST_LIMIT_S = 1200
# molecule runs every role on each stand-in release: the first is the lab's and the image stage's
RELEASES = tuple(image.RELEASES)
LAB_STAGE_LIMIT_S = 4800
STOP_GRACE = 120


@dataclass
class Outcome:
    name: str
    lane: int
    start: float
    seconds: float
    ok: bool
    note: str = ""
    usage: cpuacct.Usage | None = None  # None where this machine has no cgroup v1 cpuacct to write to


FIRST_ERRORS = re.compile(r"^(E\s+.*\berror\b.*|.*fatal: \[.*|(FAILED|ERROR) tests/.*)$", re.IGNORECASE)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
BOX = "│"  # molecule's frame around Ansible's output


def first_errors(log: Path, limit: int = 4, width: int = 300) -> list[str]:
    """The first distinct error lines of a stage's log (pytest's E lines and summary), and Ansible's last two
    fatal lines (the earlier ones are often failures a test expects and a playbook rescues), each with the task
    it failed in and its message (the lines under it), so that CI's last lines say what failed."""
    lines = [ANSI.sub("", raw).strip().lstrip(BOX).strip() for raw in log.read_text(errors="replace").splitlines()]
    found: list[str] = []
    fatal: list[str] = []
    task = ""
    for i, line in enumerate(lines):
        if line.startswith("TASK ["):
            header = line if "]" in line else " ".join(lines[i : i + 2])
            task = header[: header.find("]") + 1]
        if not FIRST_ERRORS.match(line):
            continue
        if "fatal: [" in line:
            message: list[str] = []
            for below in lines[i + 1 : i + 9]:
                if not below or below.startswith(("TASK [", "PLAY", "...ignoring")):
                    break
                message.append(below)
            if not (lines[i + 1 + len(message) : i + 2 + len(message)] or [""])[0].startswith("...ignoring"):
                fatal.append(" ".join([f"{task}:" if task else "", line, *message]).strip()[: 2 * width])
        elif len(found) < limit and line[:width] not in found:
            found.append(line[:width])
    return found + list(dict.fromkeys(fatal))[-2:]


class Stages:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.outcomes: list[Outcome] = []
        self.lock = threading.Lock()
        # The pyxis plugins built in this run are kept here for the rest of the run (role pyxis's
        # artifact directory follows XDG_CACHE_HOME), never taken from an earlier run.
        self.cache = BUILD / f"cache-{os.getpid()}"
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "XDG_CACHE_HOME": str(self.cache),
        }
        self.accounted = cpuacct.available()
        self.sampler = cpuacct.start_sampler() if self.accounted else None

    def say(self, line: str) -> None:
        with self.lock:
            print(f"[{time.monotonic() - self.t0:6.0f}s] {line}", flush=True)

    def run(
        self, name: str, lane: int, argv: list[str], env: dict[str, str] | None = None, limit: float | None = None
    ) -> bool:
        """Run one stage into build/<name>.log. A stage still running after ``limit`` seconds is
        interrupted (pytest then writes where it was and its summary), and killed if that does not end it."""
        BUILD.mkdir(exist_ok=True)
        log = BUILD / f"{name}.log"
        self.say(f"start {name}: {' '.join(argv)}")
        env = {**(env or self.env), cpuacct.STAGE_ENV: name}
        group = cpuacct.StageCgroup(name) if self.accounted else None
        if group is not None:
            group.create()
            argv, env = group.wrap(argv), {**env, **group.env()}
        (BUILD / f"cpu-tests-{name}.tsv").unlink(missing_ok=True)
        start = time.monotonic()
        note = ""
        with log.open("w") as out:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=out, env=env)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                note = f"stopped at its {limit:.0f}s limit"
                self.say(f"{name} is still running after {limit:.0f}s: interrupting it")
                proc.send_signal(signal.SIGINT)
                try:
                    rc = proc.wait(timeout=STOP_GRACE)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    rc = proc.wait()
        if rc and not note:
            note = f"exit {rc}"
        usage = group.usage(self.sampler) if group is not None else None
        outcome = Outcome(name, lane, start - self.t0, time.monotonic() - start, rc == 0 and not note, note, usage)
        return self._finish(outcome, log)

    def _finish(self, outcome: Outcome, log: Path) -> bool:
        with self.lock:
            self.outcomes.append(outcome)
        state = "passed" if outcome.ok else f"FAILED ({outcome.note})"
        self.say(f"{outcome.name} {state} in {outcome.seconds:.0f}s (log: {log.relative_to(ROOT)})")
        if not outcome.ok:
            self.show_failure(log)
        return outcome.ok

    def show_failure(self, log: Path) -> None:
        lines = log.read_text(errors="replace").splitlines()
        marks = [
            i for i, line in enumerate(lines) if any(m in line for m in ("fatal: ", "failed: [", "FAILED", "ERROR"))
        ]
        picked: list[str] = []
        for i in marks[-6:]:
            picked += [*lines[i : i + 12], "--"]
        with self.lock:
            print("\n".join((picked or lines)[-100:]), flush=True)

    def molecule(
        self, scenario: str, lane: int, image: str, release: str = RELEASES[0], ceph: str | None = None
    ) -> bool:
        """One molecule scenario on one release's image (and the Ceph fixture's, for cephfs); strings in
        molecule/<s>/secret-patterns must not reach its output."""
        env = {**self.env, "CORECTL_NODE_IMAGE": image, **({"CORECTL_CEPH_IMAGE": ceph} if ceph else {})}
        name = f"molecule-{scenario}" if release == RELEASES[0] else f"molecule-{scenario}-{release}"
        ok = self.run(name, lane, [str(BIN / "molecule"), "test", "-s", scenario], env)
        patterns = ROOT / "molecule" / scenario / "secret-patterns"
        if ok and patterns.is_file():
            output = (BUILD / f"{name}.log").read_text(errors="replace")
            leaked = [p for p in patterns.read_text().splitlines() if p and p in output]
            if leaked:
                self.say(f"{name}: a test secret appeared in the output")
                self.outcomes[-1].ok, self.outcomes[-1].note = False, "secret in output"
                ok = False
        return ok

    def table(self) -> str:
        """Each stage's wall time and CPU (user + system of its processes and containers; iowait: the
        machine's during the stage)."""
        head = f"{'stage':<22} {'lane':>4} {'start':>7} {'time':>7} {'cpu':>7} {'user':>7} {'sys':>6} {'iowait':>6}"
        rows = [f"{head}  result"]
        for o in sorted(self.outcomes, key=lambda o: o.start):
            u = o.usage
            cpu = (
                f"{u.cpu:>6.0f}s {u.user:>6.0f}s {u.system:>5.0f}s {u.iowait:>5.0f}s"
                if u
                else f"{'-':>7} {'-':>7} {'-':>6} {'-':>6}"
            )
            rows.append(
                f"{o.name:<22} {o.lane:>4} {o.start:>6.0f}s {o.seconds:>6.0f}s {cpu}  {'ok' if o.ok else o.note}"
            )
        rows.append(f"{'total (wall)':<22} {'':>4} {'':>7} {time.monotonic() - self.t0:>6.0f}s")
        return "\n".join(rows)

    def write_cpu_files(self) -> list[str]:
        """build/cpu-stages.tsv and build/cpu-containers.tsv; the lines to print: the stages' CPU against
        the machine's, and the costliest end-to-end tests."""
        if self.sampler is None:
            return ["cpu per stage: no cgroup v1 cpuacct to write to on this machine"]
        with (BUILD / "cpu-stages.tsv").open("w") as out:
            out.write("stage\tlane\tstart_s\twall_s\tuser_s\tsystem_s\tcpu_s\tmachine_iowait_s\tresult\n")
            for o in sorted(self.outcomes, key=lambda o: o.start):
                u = o.usage or cpuacct.Usage()
                out.write(
                    f"{o.name}\t{o.lane}\t{o.start:.0f}\t{o.seconds:.1f}\t{u.user:.1f}\t{u.system:.1f}\t{u.cpu:.1f}"
                    f"\t{u.iowait:.1f}\t{'ok' if o.ok else o.note}\n"
                )
        rows = self.sampler.rows()
        with (BUILD / "cpu-containers.tsv").open("w") as out:
            out.write("stage\tcontainer\tuser_s\tsystem_s\n")
            for stage, name, user, system in rows:
                out.write(f"{stage}\t{name}\t{user:.1f}\t{system:.1f}\n")
        staged = sum(o.usage.cpu for o in self.outcomes if o.usage)
        jobs = sum(user + system for stage, _, user, system in rows if stage == cpuacct.SLURM_JOBS)
        lines = [f"cpu of the stages: {staged:,.0f} s (Slurm jobs in the stand-ins besides: {jobs:,.0f} s); "
                 "build/cpu-stages.tsv, build/cpu-containers.tsv, build/cpu-tests-<stage>.tsv"]  # fmt: skip
        for o in self.outcomes:
            tests = cpuacct.read_tests(BUILD / f"cpu-tests-{o.name}.tsv")
            if o.name.startswith("lab") and tests:
                lines.append(
                    f"{o.name}: the costliest tests (cpu s, wall s; a module's first test includes its lab's set-up)"
                )
                lines += [f"  {cpu:>6.0f} {wall:>6.0f}  {test}" for test, wall, cpu in tests[:12]]
        return lines


def scenarios() -> list[str]:
    return sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))


class Images:
    """Each release's stand-in image, built once by the first lane that asks for it (stage image or
    image-<release>), and the images on it: the Ceph fixture's (image-ceph[-<release>]) and the baked one
    with the roles' Debian packages (image-baked[-<release>], molecule's nodes); a lane asking meanwhile
    waits for that build. None: the build failed."""

    KINDS = ("node", "ceph", "baked")

    def __init__(self, stages: Stages) -> None:
        self.stages = stages
        self.locks = {(release, kind): threading.Lock() for release in RELEASES for kind in self.KINDS}
        self.tags: dict[tuple[str, str], str | None] = {}

    def tag(self, release: str = RELEASES[0], lane: int = 1, kind: str = "node") -> str | None:
        if kind != "node" and self.tag(release, lane) is None:
            return None
        with self.locks[(release, kind)]:
            if (release, kind) not in self.tags:
                name = "image" if kind == "node" else f"image-{kind}"
                name = name if release == RELEASES[0] else f"{name}-{release}"
                option = [] if kind == "node" else [f"--{kind}"]
                argv = [str(BIN / "corectl"), "lab", "image", "--release", release, *option]
                built = self.stages.run(name, lane, argv)
                self.tags[(release, kind)] = (BUILD / f"{name}.log").read_text().split()[-1] if built else None
            return self.tags[(release, kind)]


class CpuLog:
    """The machine's CPU use (all cores, from /proc/stat) every ``every`` seconds into build/cpu.log, and on
    average over the run: whether the lanes wait on each other for CPU or on something else."""

    def __init__(self, stages: Stages, every: float = 10.0) -> None:
        self.stages, self.every = stages, every
        self.stop = threading.Event()
        self.first = self.read()
        self.recent: deque[float] = deque(maxlen=GATE_SAMPLES)  # the busy share of the last samples
        self.thread = threading.Thread(target=self.sample, daemon=True)

    @staticmethod
    def read() -> tuple[int, int, int]:
        """(busy, iowait, total) jiffies of all cores."""
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
        busy = user + nice + system + irq + softirq + steal
        return busy, iowait, busy + idle + iowait

    def has_idle_cpu(self) -> bool:
        """Whether the machine was less than GATE_BUSY_PERCENT busy over the last GATE_SAMPLES samples (the
        third lane's gate: it adds work only where the labs' waiting tests leave the cores idle)."""
        recent = list(self.recent)
        return len(recent) == GATE_SAMPLES and sum(recent) / len(recent) < GATE_BUSY_PERCENT

    @staticmethod
    def share(before: tuple[int, int, int], after: tuple[int, int, int]) -> tuple[float, float]:
        total = max(after[2] - before[2], 1)
        return 100 * (after[0] - before[0]) / total, 100 * (after[1] - before[1]) / total

    def sample(self) -> None:
        BUILD.mkdir(exist_ok=True)
        with (BUILD / "cpu.log").open("w") as out:
            last = self.first
            while not self.stop.wait(self.every):
                now = self.read()
                busy, iowait = self.share(last, now)
                self.recent.append(busy)
                out.write(f"{time.monotonic() - self.stages.t0:6.0f}s busy {busy:3.0f}% iowait {iowait:3.0f}%\n")
                out.flush()
                last = now

    def summary(self) -> str:
        """The run's CPU use, and what it means for the wall time: busy core-seconds / cores is the least
        time the same work takes on this machine, however the lanes are arranged."""
        self.stop.set()
        now = self.read()
        busy, iowait = self.share(self.first, now)
        cores = os.cpu_count() or 1
        used = (now[0] - self.first[0]) / os.sysconf("SC_CLK_TCK")
        return (
            f"cpu: {busy:.0f}% busy, {iowait:.0f}% iowait on average over {cores} cores; {used:,.0f} busy core-seconds "
            f"(no arrangement of the lanes runs them in under {used / cores:,.0f} s here; build/cpu.log)"
        )


def lint(stages: Stages, lane: int = 1) -> bool:
    python = " ".join(python_sources())
    ok = stages.run("ruff", lane, ["sh", "-c", f"ruff check {python} && ruff format --check {python}"])
    ok = stages.run("lint-imports", lane, [str(BIN / "lint-imports")]) and ok  # pyproject's layer contracts
    return stages.run("ansible-lint", lane, [str(BIN / "ansible-lint")]) and ok


def python_sources() -> list[str]:
    """Every Python file of the project: the packages and the in-repo collection, the Python
    packages under roles' files/ (the sources of the zipapps tools/zipapps.py builds), and the programs roles
    ship as one text file without a .py name (the GPU handover, ...), found by shebang."""
    shipped = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "roles").glob("*/files/*")
        if path.is_file()
        and path.read_bytes()[:64].startswith(b"#!")
        and b"python" in path.read_bytes()[:64]
        and not zipfile.is_zipfile(path)
    )
    packages = sorted(str(path.parent.relative_to(ROOT)) for path in (ROOT / "roles").glob("*/files/*/__init__.py"))
    return ["src", "tests", "bench", "tools", "collections", "molecule/plugins", *packages, *shipped]


# The third lane's gate: it takes its next stage only while the machine was less than this busy over the
# last samples of CpuLog (10 s apart); a closed gate is looked at again every GATE_POLL_S.
GATE_BUSY_PERCENT = 70
GATE_SAMPLES = 3
GATE_POLL_S = 10
# the scenarios with the Ceph fixture (its own image: CORECTL_CEPH_IMAGE)
CEPH_SCENARIOS = ("cephfs",)
# the scenarios' usual cost, most first: a lane that frees up late takes what is left, short ones last
MOLECULE_ORDER = ("slurm", "gpu", "cephfs", "base", "users")


@dataclass(frozen=True)
class Tail:
    """One stage of the run's tail: ``key`` is what it holds while it runs (a molecule scenario's instance
    names, network and state directory; a lab's name), so two stages with one key never run at once."""

    key: str
    run: Callable[[int], bool]


class TailQueue:
    """The stages after the labs, shared by every lane that has finished its own work: the Debian 13 lab
    first (when the run has it), then the molecule stages (each scenario on each release, most costly first).
    Whichever lane is free takes the next, so the lanes end close together; a lane given a ``gate`` takes its
    next stage only while the gate is open (the third lane: while the machine has idle CPU) or goes home
    when the queue is empty. A scenario never runs on two releases at once."""

    def __init__(
        self, stages: Stages, images: Images, names: list[str], releases: list[str], first: list[Tail] | None = None
    ) -> None:
        self.stages, self.images = stages, images
        cost = {name: i for i, name in enumerate(MOLECULE_ORDER)}
        ordered = sorted(names, key=lambda name: (cost.get(name, len(cost)), name))
        self.waiting: list[Tail] = [*(first or []), *(self.scenario(n, r) for n in ordered for r in releases)]
        self.running: set[str] = set()
        self.changed = threading.Condition()

    def scenario(self, name: str, release: str) -> Tail:
        def run(lane: int) -> bool:
            # the baked image: the install from the bare one is proven by each lab's first provision
            tag = self.images.tag(release, lane, kind="baked")
            ceph = self.images.tag(release, lane, kind="ceph") if name in CEPH_SCENARIOS else None
            ran = tag is not None and (ceph is not None or name not in CEPH_SCENARIOS)
            return ran and self.stages.molecule(name, lane, tag, release, ceph)

        return Tail(name, run)

    def take(self, gate: Callable[[], bool] | None = None) -> Tail | None:
        with self.changed:
            while self.waiting:
                free = [tail for tail in self.waiting if tail.key not in self.running]
                if free and (gate is None or gate()):
                    self.waiting.remove(free[0])
                    self.running.add(free[0].key)
                    return free[0]
                # a closed gate is the machine's load: looked at again when a stage ends or the load is sampled
                self.changed.wait(timeout=None if gate is None else GATE_POLL_S)
            return None

    def work(self, lane: int, gate: Callable[[], bool] | None = None) -> bool:
        """Run stages from the queue until it is empty; False when any stage of this lane's failed."""
        ok = True
        while (tail := self.take(gate)) is not None:
            try:
                ok = tail.run(lane) and ok
            finally:
                with self.changed:
                    self.running.discard(tail.key)
                    self.changed.notify_all()
        return ok


def in_parallel(*lanes: object) -> list[bool]:
    results: list[bool] = [False] * len(lanes)

    def work(i: int, fn: object) -> None:
        results[i] = bool(fn())  # type: ignore[operator]

    threads = [threading.Thread(target=work, args=(i, fn)) for i, fn in enumerate(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "all"
    stages = Stages()
    pytest = [str(BIN / "pytest"), "-ra", "-p", "no:cacheprovider"]
    lab_run = [*pytest, "-v", "--durations=15", f"--timeout={LAB_TEST_LIMIT_S}"]
    lab_tests = [*lab_run, "-m", "lab"]  # the whole suite on one lab
    # the smaller end-to-end test on the second release (its own lab: tests/e2e/test_release_e2e.py)
    release_tests = [*pytest, "-v", f"--timeout={LAB_TEST_LIMIT_S}", "-m", "lab_release", "tests/e2e"]
    unit_tests = [*pytest, "-m", "not lab and not lab_release"]
    # the suite's second half on a second lab beside the first (tests/e2e/lab.py's LABS)
    fleet_tests = [*lab_run, "-m", "second_lab or every_lab"]
    first_lab_tests = [*lab_run, "-m", "lab and not second_lab"]  # the rest, beside it (make test)
    images = Images(stages)

    cpu = CpuLog(stages)

    # The e2e tests run under Mitogen (2x faster here; docs/performance.md), and so does every molecule
    # scenario (.config/molecule/config.yml); CORECTL_ACCELERATOR=none make test runs the labs stock. The
    # Debian 13 lab on corectl's default strategy (CORECTL_RELEASE_ACCELERATOR=none) cost 948 CPU-s against
    # the suite's CPU budget in session 29 and pushed the lab past its limit: not by default yet.
    lab_env = {**stages.env, "CORECTL_ACCELERATOR": os.environ.get("CORECTL_ACCELERATOR", "mitogen")}
    release = os.environ.get("CORECTL_RELEASE_ACCELERATOR", lab_env["CORECTL_ACCELERATOR"])
    release_env = {**stages.env, "CORECTL_ACCELERATOR": release}
    # The second Debian 12 lab starts from the baked image (the roles' Debian packages in it): the install from the
    # bare image is proven on this release by the first lab's first provision in the same run, and on Debian 13 by
    # its lab's; the second lab's first provision proves the rest of a whole-site run (configuration, services,
    # secrets, Slurm) as the first does. `python tests/stages.py lab-fleet` alone does the same.
    fleet_env = {**lab_env, "CORECTL_E2E_LAB": "labfleet", NODE_IMAGE_ENV: "baked"}

    def lab(name: str, lane: int, argv: list[str], env: dict[str, str], release: str = RELEASES[0]) -> bool:
        ready = images.tag(release, lane) is not None
        if env.get(NODE_IMAGE_ENV) == "baked":  # built as its own stage, not inside the lab's
            ready = ready and images.tag(release, lane, kind="baked") is not None
        return ready and stages.run(name, lane, argv, env, LAB_STAGE_LIMIT_S)

    trixie = f"lab-{RELEASES[1]}"
    # in `all` the Debian 13 lab is the tail's first stage (its longest), taken by whichever lane is free first
    first = [Tail(trixie, lambda lane: lab(trixie, lane, release_tests, release_env, RELEASES[1]))]
    asked = argv[1:] if what == "molecule" else []
    queue = TailQueue(
        stages,
        images,
        [a for a in asked if a not in RELEASES] or scenarios(),
        [r for r in RELEASES if r in asked] or list(RELEASES),
        first if what == "all" else [],
    )

    # In `all` the suite is split over two labs: the second_lab tests (independent of the others' state) run
    # on a second lab in lane 2 while lane 1 runs the rest; a lane takes from the tail once its own stages are
    # done, and a third lane takes from it from the start, each stage only while the machine has idle CPU (the
    # labs' waiting tests leave the cores 40-60 % idle for stretches of minutes: docs/testing.md, session 37).
    def lab_then_tail() -> bool:
        ran = lab("lab", 1, first_lab_tests, lab_env)
        return queue.work(1) and ran

    def checks_then_tail() -> bool:
        linted = lint(stages, lane=2)
        unit = stages.run("unit", 2, unit_tests)
        fleet = lab("lab-fleet", 2, fleet_tests, fleet_env)
        tail = queue.work(2)
        return tail and fleet and unit and linted

    stages_of = {
        "all": lambda: in_parallel(lab_then_tail, checks_then_tail, lambda: queue.work(3, gate=cpu.has_idle_cpu)),
        "lint": lambda: lint(stages),
        # the inner loop beside lint, on both cores (pytest-xdist): make check. loadgroup: the tests that
        # share a costly module-scoped fixture are marked xdist_group and run on one worker (tests/conftest.py)
        "check": lambda: all(
            in_parallel(
                lambda: lint(stages), lambda: stages.run("unit", 2, [*unit_tests, "-n", "2", "--dist", "loadgroup"])
            )
        ),
        "unit": lambda: stages.run("unit", 1, unit_tests),
        "image": images.tag,
        "lab": lambda: lab("lab", 1, lab_tests, lab_env),
        "lab-fleet": lambda: lab("lab-fleet", 1, fleet_tests, fleet_env),
        trixie: lambda: lab(trixie, 1, release_tests, release_env, RELEASES[1]),
        "molecule": lambda: queue.work(1),
    }
    if what not in stages_of:
        print(__doc__, file=sys.stderr)
        return 2
    cpu.thread.start()
    try:
        stages_of[what]()
    finally:
        shutil.rmtree(stages.cache, ignore_errors=True)
    return report(stages, cpu)


def report(stages: Stages, cpu: CpuLog) -> int:
    """The table, the machine's and each stage's CPU, pytest's closing lines, the first errors; the exit status."""
    print("\n" + stages.table(), flush=True)
    print(cpu.summary(), flush=True)
    for line in stages.write_cpu_files():
        print(line, flush=True)
    for name in ("unit", "lab", "lab-fleet", f"lab-{RELEASES[1]}"):  # pytest's own closing lines
        log = BUILD / f"{name}.log"
        if any(o.name == name for o in stages.outcomes):
            closing = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("=")]
            print(f"pytest {name}: {closing[-1].strip('= ') if closing else 'no summary'}", flush=True)
    failed = [o.name for o in stages.outcomes if not o.ok]
    for name in failed:
        for line in first_errors(BUILD / f"{name}.log"):
            print(f"{name}: {line}", flush=True)
    why = ": " + ", ".join(f"{o.name} ({o.note})" for o in stages.outcomes if not o.ok) if failed else ""
    print(f"stages: {len(stages.outcomes) - len(failed)} passed, {len(failed)} failed{why}", flush=True)
    if "image" in failed:
        print("the image failed: the lab and molecule stages did not run", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
