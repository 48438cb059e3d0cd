"""CPU of each test stage, of each stand-in container and of each end-to-end test, read from the
kernel's cgroup accounting (cgroup v1 `cpuacct`, as on these machines).

Every stage of `make test` runs in a cgroup of its own, /corectl-test/<stage>: its processes join it
when they start, and the containers that corectl's lab starts for it go below it (`docker run
--cgroup-parent` from CORECTL_CGROUP_PARENT). cpuacct charges a cgroup's CPU to every cgroup above it
as it is used, so a stage's figure keeps what its containers used after they are removed. Molecule's
docker driver has no cgroup parent: its containers are Docker's own (/docker/<id>), labelled with the
stage (corectl.stage, from CORECTL_STAGE), and read every ``every`` seconds while they run; their last
readings are added to the stage's figure (what a container used between its last reading and its
removal, at most ``every`` seconds of it, is missed).
Slurm's job cgroups are not below the stage: with --cgroupns=host Slurm makes them at the root as
/slurm_<node>, so they are sampled the same way and listed by node.

Iowait is not charged to a cgroup by the kernel: a stage's iowait is the machine's during the
stage's time (shared with the other lane's stage running then).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from corectl.lab.docker import CGROUP_PARENT_ENV, STAGE_ENV, STAGE_LABEL
from corectl.lab.nodes import remove_cgroup_tree

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
PARENT = "corectl-test"
ENV_DIR = "CORECTL_STAGE_CGROUP"  # the stage's cpuacct directory, for the per-test hook (tests/conftest.py)
TICK = os.sysconf("SC_CLK_TCK")
CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")
SLURM_JOBS = "(slurm jobs)"


def available() -> bool:
    return (CPUACCT / "cpuacct.stat").is_file() and os.access(CPUACCT, os.W_OK)


def stat(directory: Path) -> tuple[float, float]:
    """(user, system) CPU-seconds used in a cgroup and every cgroup below it."""
    try:
        fields = dict(line.split() for line in (directory / "cpuacct.stat").read_text().splitlines())
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(fields.get("user", 0)) / TICK, int(fields.get("system", 0)) / TICK


def machine_iowait() -> float:
    """Seconds all cores have spent in iowait since boot."""
    return int(Path("/proc/stat").read_text().split()[5]) / TICK


@dataclass
class Usage:
    user: float = 0.0
    system: float = 0.0
    iowait: float = 0.0

    @property
    def cpu(self) -> float:
        return self.user + self.system


class StageCgroup:
    """One stage's cgroup: made anew, joined by the stage's first process, read when the stage ends."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = CPUACCT / PARENT / name
        self.docker_parent = f"/{PARENT}/{name}"
        self.start: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def create(self) -> None:
        """The cgroup, new where it can be (one an earlier run's processes still use is kept: the stage's
        figures are counted from now)."""
        if self.path.is_dir():
            with contextlib.suppress(OSError):
                remove_cgroup_tree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.start = (*stat(self.path), machine_iowait())

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started inside the cgroup (its children stay in it)."""
        procs = self.path / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "stage", *argv]

    def env(self) -> dict[str, str]:
        return {CGROUP_PARENT_ENV: self.docker_parent, ENV_DIR: str(self.path), STAGE_ENV: self.name}

    def usage(self, sampler: ContainerSampler | None = None) -> Usage:
        """Since create(): the cgroup's CPU, plus the last readings of the stage's containers outside it
        (molecule's) when a sampler watched them."""
        user, system = stat(self.path)
        if sampler is not None:
            outside = sampler.outside(self.name)
            user, system = user + outside[0], system + outside[1]
        return Usage(user - self.start[0], system - self.start[1], machine_iowait() - self.start[2])


class ContainerSampler:
    """Every ``every`` seconds: the CPU of each container of a stage and of each Slurm job tree
    (/slurm_<node>), keeping the last reading of each. Containers that corectl's lab starts are below
    their stage's cgroup (--cgroup-parent) and so already in its figure; molecule's (its docker driver
    has no cgroup parent) are Docker's own, /docker/<id>, found by their corectl.stage label, and their
    last readings are added to their stage's figure."""

    def __init__(self, every: float = 2.0) -> None:
        self.every = every
        self.stop = threading.Event()
        self.known: dict[str, tuple[str, str]] = {}  # container id: (name, stage label)
        self.last: dict[tuple[str, str], tuple[float, float]] = {}  # (stage, id): (user, system)
        self.inside: set[str] = set()  # ids of containers below a stage's cgroup
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def _learn(self) -> None:
        fmt = '{{.ID}} {{.Names}} {{.Label "' + STAGE_LABEL + '"}}'
        proc = subprocess.run(
            ["docker", "ps", "-a", "--no-trunc", "--format", fmt], capture_output=True, text=True, check=False
        )
        for line in proc.stdout.splitlines():
            cid, name, stage = ([*line.split(" "), "", ""])[:3]
            self.known[cid] = (name, stage)

    def sample(self) -> None:
        found: dict[tuple[str, str], tuple[float, float]] = {}
        inside: set[str] = set()
        root = CPUACCT / PARENT
        for stage in root.iterdir() if root.is_dir() else ():
            for child in stage.iterdir() if stage.is_dir() else ():
                if child.is_dir() and CONTAINER_ID.match(child.name):
                    found[(stage.name, child.name)] = stat(child)
                    inside.add(child.name)
        docker_dir = CPUACCT / "docker"
        ids = [c.name for c in docker_dir.iterdir() if CONTAINER_ID.match(c.name)] if docker_dir.is_dir() else []
        if any(cid not in self.known for cid in [*ids, *inside]):
            self._learn()
        for cid in ids:
            stage = self.known.get(cid, ("", ""))[1]
            if stage:
                found[(stage, cid)] = stat(docker_dir / cid)
        for tree in CPUACCT.glob("slurm_*"):
            found[(SLURM_JOBS, tree.name)] = stat(tree)
        with self.lock:
            self.last.update(found)
            self.inside |= inside

    def run(self) -> None:
        while not self.stop.wait(self.every):
            self.sample()

    def outside(self, stage: str) -> tuple[float, float]:
        """(user, system) of the stage's containers that are not below its cgroup (molecule's)."""
        with self.lock:
            readings = [v for (s, cid), v in self.last.items() if s == stage and cid not in self.inside]
        return sum(r[0] for r in readings), sum(r[1] for r in readings)

    def rows(self) -> list[tuple[str, str, float, float]]:
        """(stage, container or Slurm job tree, user s, system s), most CPU first."""
        self.sample()
        with self.lock:
            rows = [(s, self.known.get(cid, (cid[:12], ""))[0], u, y) for (s, cid), (u, y) in self.last.items()]
        return sorted(rows, key=lambda row: -(row[2] + row[3]))


def start_sampler(every: float = 2.0) -> ContainerSampler:
    sampler = ContainerSampler(every)
    sampler.thread.start()
    return sampler


def stage_usage_now() -> tuple[float, float] | None:
    """The current stage's (user, system) CPU-seconds so far, when the tests run inside a stage."""
    directory = os.environ.get(ENV_DIR)
    return stat(Path(directory)) if directory else None


def record_test(nodeid: str, wall: float, before: tuple[float, float], after: tuple[float, float]) -> None:
    """One line of build/cpu-tests-<stage>.tsv (tests/conftest.py's hook, inside a stage)."""
    stage = os.environ.get(STAGE_ENV, "")
    build = Path(__file__).resolve().parents[1] / "build"
    path = build / f"cpu-tests-{stage}.tsv"
    new = not path.exists()
    with path.open("a") as out:
        if new:
            out.write("test\twall_s\tuser_s\tsystem_s\tcpu_s\n")
        user, system = after[0] - before[0], after[1] - before[1]
        out.write(f"{nodeid}\t{wall:.1f}\t{user:.1f}\t{system:.1f}\t{user + system:.1f}\n")


def read_tests(path: Path) -> list[tuple[str, float, float]]:
    """(test, wall s, cpu s) of a stage's tests, most CPU first."""
    if not path.is_file():
        return []
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:]]
    return sorted(((r[0], float(r[1]), float(r[4])) for r in rows if len(r) == 5), key=lambda r: -r[2])
