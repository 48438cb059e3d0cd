"""`make bench`: what a corectl run costs and how that grows with the cluster.

Every figure is printed beside a baseline measured in the same run (these machines are noisy):

  render   validate + render at 13, 1,000 and 10,000 nodes (time, peak RSS) and
           `ansible-inventory --list` on the 10,000-node hosts.yml; ratio to the 13-node site.
  full     a full provision of a fresh bench lab (head + --full-dgx DGX, 2 by default), with its
           ten slowest tasks; that lab is removed before the no-op series starts.
  noop     no-op provision of the converged lab at each size in --sizes (DGX stand-ins + head):
           corectl's default, corectl with CORECTL_ACCELERATOR=mitogen, the run fanned out over
           two runner stand-ins (cluster.yml control, Mitogen on the runners), node-local runs
           (cluster.yml node_local: each DGX runs its own plays), and the same playbook and
           inventory run by plain ansible-playbook with Ansible's stock settings (no pipelining,
           forks 5, no fact cache); wall time, control-host CPU, the slope per added node and each
           variant's ratio to stock; and the SSH floor (`ansible all -m ping` over the same hosts,
           stock settings, best of two) with each variant's wall time as a multiple of it. The
           runners' and the nodes' own CPU is not the control host's and is not counted (on this
           machine they share its cores: wall times here are those of one machine doing everything).
  addnode  wall time and hosts touched by add-node beside 1 and beside 4 existing DGX.

With two or more no-op sizes the report also projects each variant's controller CPU per added
DGX to 128, 1,024 and 12,288 nodes, and the node-local no-op's wall time from one control host.

    .venv/bin/python bench/fleet.py [--sizes 1,2,4,8] [--full-dgx 2] [--only render,full,noop,addnode] [--keep]

The bench lab is its own (172.29.220.0/24, SSH ports 22400+, names bench-*): never run it while
the e2e test or another lab uses the same machine, the figures would be meaningless. Results go
to build/bench.json and are printed as one table; a run of every part also writes that table into
docs/performance.md (between its "bench:begin" and "bench:end" markers), with the command that
reproduces it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CORECTL = str(BIN / "corectl")
SITE = ROOT / "build" / "bench" / "benchlab"
SUBNET, PORT_BASE, PREFIX = "172.29.220.0/24", 22400, "bench-"
RESULTS = ROOT / "build" / "bench.json"
DOC = ROOT / "docs" / "performance.md"
DOC_BEGIN, DOC_END = "<!-- bench:begin -->", "<!-- bench:end -->"
PARTS = ("render", "full", "noop", "addnode")
PROJECT_NODES = (128, 1_024, 12_288)
PROJECT_CORES = 16  # a control host's cores, for the "spread perfectly" column
sys.path.insert(0, str(Path(__file__).resolve().parent))

from render_scale import site_with  # noqa: E402

from corectl.ansible.records import load_runs  # noqa: E402
from corectl.site import Site, resolve_site  # noqa: E402


@dataclass
class Sample:
    wall: float
    cpu: float  # user + system seconds of the command and every child it waited for
    rss_mb: float
    output: str
    record: dict[str, Any] | None = None  # the run record of a provision, where the bench reads it


def measure(argv: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> Sample:
    """Run a command; its wall time, CPU and peak RSS (wait4 counts the children it reaped)."""
    with tempfile.TemporaryFile("w+") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        text = out.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench: {' '.join(argv)} failed:\n{text[-3000:]}")
    return Sample(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, text)


# --- render ------------------------------------------------------------------------------------

RENDER_CHILD = """
import sys, time
from pathlib import Path
from corectl.site.loader import load_cluster
from corectl.site.render import write
start = time.perf_counter()
write(load_cluster(Path(sys.argv[1])), Path(sys.argv[2]))  # hosts.yml, nodes.json, switches.json
print(f"{time.perf_counter() - start:.4f}")
"""


def bench_render() -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dgx in (12, 999, 9999):
            site = site_with(dgx, Path(tmp)) if dgx != 12 else ROOT / "inventories" / "prod"
            out = Path(tmp) / f"rendered{dgx}"
            out.mkdir()
            hosts = out / "hosts.yml"
            sample = measure([sys.executable, "-c", RENDER_CHILD, str(site), str(out)])
            rows.append(
                {
                    "nodes": dgx + 1,
                    "render_s": float(sample.output.split()[-1]),
                    "wall_s": sample.wall,
                    "peak_rss_mb": sample.rss_mb,
                }
            )
        # plain --list merges all.vars into every host: the node and switch lists live in nodes.json
        # and switches.json (read where a role uses them) and the site-wide settings in site.json
        # (extra vars of each run), so this grows with the node count, not its square
        inventory = measure([str(BIN / "ansible-inventory"), "-i", str(hosts), "--list"])
        rows[-1]["ansible_inventory_s"] = inventory.wall
        rows[-1]["ansible_inventory_rss_mb"] = inventory.rss_mb
        exported = measure([str(BIN / "ansible-inventory"), "-i", str(hosts), "--list", "--export"])
        rows[-1]["ansible_inventory_export_s"] = exported.wall
    base = rows[0]["render_s"] / rows[0]["nodes"]
    for row in rows:
        row["per_node_ratio"] = (row["render_s"] / row["nodes"]) / base
    return rows


# --- lab ---------------------------------------------------------------------------------------


def corectl(*args: str, env: dict[str, str] | None = None) -> Sample:
    return measure([CORECTL, *args, "--inventory", str(SITE)], env)


def bench_site() -> Site:
    return resolve_site(str(SITE), ROOT)


def last_run() -> dict[str, Any]:
    """The newest run record (corectl runs' own reader), with its artifacts directory."""
    record = load_runs(bench_site())[-1]
    return {**record, "dir": bench_site().runs_dir / record["id"]}


def task_times(run_dir: Path) -> list[tuple[float, str]]:
    """Wall seconds of each task (task start to the next task's start), slowest first."""
    starts = []
    for path in (run_dir / "job_events").glob("*.json"):
        event = json.loads(path.read_text())
        if event["event"] == "playbook_on_task_start":
            data = event["event_data"]
            starts.append(
                (
                    event["counter"],
                    datetime.fromisoformat(event["created"]),
                    f"{data.get('role') or '-'}: {data.get('task')}",
                )
            )
    starts.sort()
    times: dict[str, float] = defaultdict(float)
    for (_, start, name), (_, end, _) in itertools.pairwise(starts):
        times[name] += (end - start).total_seconds()
    return sorted(((t, n) for n, t in times.items()), reverse=True)


def changed_hosts(record: dict[str, Any]) -> dict[str, int]:
    return {host: stats["changed"] for host, stats in record["hosts"].items()}


STOCK_CFG = """[defaults]
roles_path = {root}/roles
collections_path = {root}/collections
interpreter_python = auto_silent
force_valid_group_names = ignore
retry_files_enabled = False
"""


def stock_run(tmp: Path, command: str, *args: str) -> Sample:
    """An Ansible command (``ansible-playbook``, ``ansible``) over the bench site's inventory with Ansible's stock
    settings: corectl's inventory, site settings and secrets, none of its ansible.cfg."""
    from corectl.ansible.runner import shared_inventory, ssh_extra_args
    from corectl.secrets import vault_password_client

    site = bench_site()
    private = Path(tempfile.mkdtemp(dir=tmp))
    cfg = private / "ansible.cfg"
    cfg.write_text(STOCK_CFG.format(root=ROOT))
    with vault_password_client(site, private) as vault:
        argv = [
            str(BIN / command),
            "-i",
            str(shared_inventory(private, ROOT)),
            "-i",
            str(site.hosts_file),
            "--extra-vars",
            f"@{site.site_file}",
            "--extra-vars",
            f"@{site.directory / 'secrets' / 'secrets.yml'}",
            "--vault-password-file",
            str(vault),
            *args,
        ]
        env = {
            "ANSIBLE_CONFIG": str(cfg),
            "ANSIBLE_SSH_EXTRA_ARGS": ssh_extra_args(site.known_hosts),
            "ANSIBLE_FORCE_COLOR": "0",
        }
        return measure(argv, env)


def stock_noop(tmp: Path) -> Sample:
    """The site playbook through plain ansible-playbook with Ansible's stock settings."""
    sample = stock_run(tmp, "ansible-playbook", str(ROOT / "playbooks" / "site.yml"))
    recap = sample.output[sample.output.rfind("PLAY RECAP") :]
    counts = [int(n) for n in re.findall(r"\bchanged=(\d+)", recap)]
    if not counts or any(counts):
        raise SystemExit(f"bench: the stock run changed something:\n{recap}")
    return sample


def ssh_floor(tmp: Path) -> Sample:
    """The SSH floor: ``ansible all -m ping`` over the same hosts with stock settings, best (least wall) of two.
    A no-op can not cost less than reaching every host once; each variant's wall time is printed against it."""
    return min((stock_run(tmp, "ansible", "all", "-m", "ansible.builtin.ping") for _ in range(2)), key=lambda s: s.wall)


VARIANTS = ("stock", "corectl", "mitogen", "runners", "nodelocal")
NODE_LOCAL = "node_local:\n  mode: 'on'\n  parallel: 32\n"
SECTIONS: dict[str, str] = {}  # cluster.yml's sections that only some variants run with (see lab_up)


def top_sections(text: str) -> dict[str, str]:
    """cluster.yml's top-level sections, by key, each with its lines (the lab writes plain block YAML)."""
    sections: dict[str, str] = {}
    key = ""
    for line in text.splitlines(keepends=True):
        if line[:1] not in (" ", "-", "#", "\n", "") and ":" in line:
            key = line.split(":", 1)[0]
        sections[key] = sections.get(key, "") + line
    return sections


def with_sections(*extra: str) -> None:
    """cluster.yml as the lab wrote it but for the control section, plus ``extra`` text."""
    sections = top_sections(SITE.joinpath("cluster.yml").read_text())
    kept = {k: v for k, v in sections.items() if k not in ("control", "node_local")}
    SITE.joinpath("cluster.yml").write_text("".join(kept.values()) + "".join(extra))


def provision_as(variant: str) -> Sample:
    """A no-op of ``variant`` (the cluster.yml it needs in place only for it); refused if it changed anything."""
    env = {"CORECTL_ACCELERATOR": "none" if variant == "corectl" else "mitogen"}
    with_sections(SECTIONS["control"] if variant == "runners" else "", NODE_LOCAL if variant == "nodelocal" else "")
    try:
        sample = corectl("provision", env=env)
    finally:
        with_sections()
    record = last_run()
    if record.get("status") != "successful" or any(changed_hosts(record).values()):
        said = f"{record.get('status')}, {changed_hosts(record)}"
        raise SystemExit(f"bench: the {variant} no-op did not pass unchanged: {said}")
    shards = record.get("shards") or []
    if variant in ("runners", "nodelocal") and len(shards) < 2:
        raise SystemExit(f"bench: the {variant} no-op ran without its shards: {shards}")
    sample.record = record
    return sample


def part_times(shards: list[dict[str, Any]]) -> tuple[float, float]:
    """A node-local run's wall seconds: its service nodes' part, and the median node job's."""
    jobs = sorted(s["elapsed"] for s in shards if s["name"] != "services")
    return next(s["elapsed"] for s in shards if s["name"] == "services"), jobs[len(jobs) // 2]


def noop(tmp: Path, dgx: int) -> dict[str, Any]:
    """One no-op of each variant, in rotating order (drift in machine load hits each alike). Node-local runs
    once before (a node added since gets the control host's Ansible in it: not the steady state)."""
    row: dict[str, Any] = {"dgx": dgx}
    provision_as("nodelocal")
    order = VARIANTS[dgx % len(VARIANTS) :] + VARIANTS[: dgx % len(VARIANTS)]
    for variant in order:
        sample = stock_noop(tmp) if variant == "stock" else provision_as(variant)
        row[variant] = {"wall_s": round(sample.wall, 1), "cpu_s": round(sample.cpu, 1)}
        if variant == "nodelocal":
            services_s, node_job_s = part_times(sample.record["shards"])
            row[variant] |= {
                "corectl_cpu_s": sample.record.get("control_cpu_s", {}).get("corectl"),
                "services_s": round(services_s, 1),
                "node_job_s": round(node_job_s, 1),
            }
        print(f"  {dgx} DGX  {variant:9s} {sample.wall:6.1f} s wall  {sample.cpu:6.1f} s controller CPU", flush=True)
    floor = ssh_floor(tmp)
    row["floor"] = {"wall_s": round(floor.wall, 2), "cpu_s": round(floor.cpu, 2)}
    print(f"  {dgx} DGX  SSH floor {floor.wall:6.2f} s wall (ansible all -m ping, best of two)", flush=True)
    return row


def grow(to: int, now: int) -> list[dict[str, Any]]:
    """Start DGX stand-ins and add-node them until the lab has ``to``; each add-node is timed."""
    added = []
    for index in range(now + 1, to + 1):
        name = f"{PREFIX}dgx{index:02d}"
        corectl("lab", "add")
        sample = corectl(
            "add-node", name, "--address", f"172.29.220.{10 + index}", "--profile", "dgx-standin",
            "--leaf", "leaf1", "--ssh-host", "127.0.0.1", "--ssh-port", str(PORT_BASE + index),
        )  # fmt: skip
        touched: Counter[str] = Counter()
        for record in load_runs(bench_site()):
            if record["command"].startswith(f"add-node {name}"):
                touched.update(h for h, s in record["hosts"].items() if s["changed"])
        added.append({"node": name, "existing_dgx": index - 1, "wall_s": round(sample.wall, 1),
                      "hosts_changed": sorted(touched)})  # fmt: skip
        print(f"  add-node {name} beside {index - 1} DGX: {sample.wall:.1f} s, changed {sorted(touched)}", flush=True)
    return added


def lab_up(dgx: int) -> None:
    """A fresh bench lab of the head, ``dgx`` DGX stand-ins and two runner stand-ins (whatever was there is
    removed). Its control section (the runners) is kept aside: only the runners variant runs with it."""
    SITE.parent.mkdir(parents=True, exist_ok=True)
    measure([CORECTL, "lab", "down", "--inventory", str(SITE)])
    corectl(
        "lab", "up", "--nodes", str(dgx), "--subnet", SUBNET, "--ssh-port-base", str(PORT_BASE),
        "--prefix", PREFIX, "--no-ceph", "--runners", "2",
    )  # fmt: skip
    SECTIONS["control"] = top_sections(SITE.joinpath("cluster.yml").read_text())["control"]
    corectl("runners", "bootstrap")
    with_sections()


def bench_full(dgx: int) -> dict[str, Any]:
    """The first provision of a fresh lab: wall time, controller CPU, the ten slowest tasks."""
    lab_up(dgx)
    full = corectl("provision")
    print(f"  full provision, head + {dgx} DGX: {full.wall:.1f} s", flush=True)
    return {
        "dgx": dgx,
        "wall_s": round(full.wall, 1),
        "cpu_s": round(full.cpu, 1),
        "slowest": [[round(t, 1), n] for t, n in task_times(last_run()["dir"])[:10]],
    }


def bench_lab(sizes: list[int], full_dgx: int, only: set[str], keep: bool) -> dict[str, Any]:
    results: dict[str, Any] = {"noop": [], "addnode": []}
    try:
        if "full" in only:
            results["full"] = bench_full(full_dgx)
        if not only & {"noop", "addnode"}:
            return results
        # the series grows one lab from the smallest size; its first provision is not the figure
        # above unless the sizes start there (then the lab is reused)
        if results.get("full", {}).get("dgx") != sizes[0]:
            lab_up(sizes[0])
            corectl("provision")
        with tempfile.TemporaryDirectory() as tmp:
            now = sizes[0]
            for size in sizes:
                if size > now:
                    added = grow(size, now)
                    now = size
                    if "addnode" in only:  # the pair: beside 1 and beside 4 existing DGX
                        results["addnode"] += [a for a in added if a["existing_dgx"] in (1, 4)]
                if "noop" in only:
                    results["noop"].append(noop(Path(tmp), size))
    finally:
        if not keep:
            measure([CORECTL, "lab", "down", "--inventory", str(SITE)])
    return results


# --- report ------------------------------------------------------------------------------------


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares seconds per added DGX."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def report(results: dict[str, Any]) -> str:
    lines = [f"corectl bench, {datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {os.cpu_count()} CPUs", ""]
    for row in results.get("render", []):
        extra = ""
        if "ansible_inventory_s" in row:
            seconds, peak = row["ansible_inventory_s"], row["ansible_inventory_rss_mb"]
            extra = (
                f"; ansible-inventory --list {seconds:.2f} s, {peak:.0f} MB"
                f" (--export {row['ansible_inventory_export_s']:.2f} s)"
            )
        lines.append(
            f"render {row['nodes']:6d} nodes: {row['render_s']:6.2f} s, peak {row['peak_rss_mb']:5.0f} MB, "
            f"per-node cost x{row['per_node_ratio']:.2f} of the 13-node site{extra}"
        )
    if "full" in results:
        full = results["full"]
        lines += [
            "",
            f"full provision, fresh lab (head + {full['dgx']} DGX): {full['wall_s']} s wall, "
            f"{full['cpu_s']} s controller CPU; slowest tasks:",
        ]
        lines += [f"  {t:6.1f} s  {n}" for t, n in full["slowest"]]
    if results.get("noop"):
        lines += ["", "no-op provision   " + "".join(f"{v:>22s}" for v in VARIANTS) + "   control-host CPU vs stock"]
        for row in results["noop"]:
            cells = "".join(f"{row[v]['wall_s']:8.1f} s ({row[v]['cpu_s']:5.1f} cpu)" for v in VARIANTS)
            ratios = " ".join(f"{v} x{row[v]['cpu_s'] / row['stock']['cpu_s']:.2f}" for v in VARIANTS[1:])
            lines.append(f"  head + {row['dgx']} DGX   {cells}   {ratios}")
        lines += floor_lines(results["noop"])
        for variant in VARIANTS if len(results["noop"]) > 1 else ():  # a slope needs two sizes
            per = slope([(row["dgx"], row[variant]["wall_s"]) for row in results["noop"]])
            lines.append(f"  {variant}: {per:.1f} s wall per added DGX")
    for added in results.get("addnode", []):
        lines.append(
            f"add-node beside {added['existing_dgx']} DGX: {added['wall_s']} s, hosts changed: "
            f"{', '.join(added['hosts_changed'])}"
        )
    if len(results.get("addnode", [])) == 2:
        first, last = results["addnode"]
        lines.append(
            f"add-node wall-time ratio ({last['existing_dgx']} vs {first['existing_dgx']} existing DGX): "
            f"{last['wall_s'] / first['wall_s']:.2f}"
        )
    if len(results.get("noop", [])) > 1:
        lines += ["", *projection(results["noop"])]
    return "\n".join(lines)


def floor_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Each variant's no-op wall time as a multiple of the SSH floor measured beside it (issue 49's measure)."""
    lines = []
    for row in rows:
        if "floor" not in row:  # a results file of a bench from before the floor was measured
            continue
        floor = row["floor"]["wall_s"]
        ratios = "  ".join(f"{v} x{row[v]['wall_s'] / floor:.1f}" for v in VARIANTS)
        lines.append(f"  head + {row['dgx']} DGX wall vs the SSH floor ({floor:.2f} s, ansible all -m ping): {ratios}")
    return lines


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def projection(rows: list[dict[str, Any]]) -> list[str]:
    """Each variant's no-op controller CPU per added DGX (least squares), times the node count.

    The CPU time is what one control host spends; divided by its cores it is the best wall time
    that host could reach if Ansible spread the work perfectly (it does not: one strategy process
    per run, forks capped, a linear strategy waits for the slowest host at every task).
    """
    lines = [
        "no-op projected from its controller CPU per added DGX: CPU time, and (in brackets) that time",
        f"spread perfectly over {PROJECT_CORES} cores",
        "             per DGX" + "".join(f"{f'{n:,d} nodes':>22s}" for n in PROJECT_NODES),
    ]
    for variant in VARIANTS:
        per = slope([(row["dgx"], row[variant]["cpu_s"]) for row in rows])
        cells = "".join(f"{duration(per * n):>12s} ({duration(per * n / PROJECT_CORES):>7s})" for n in PROJECT_NODES)
        lines.append(f"  {variant:9s} {per:5.2f} CPU-s{cells}")
    return lines + node_local_wall(rows)


def node_local_wall(rows: list[dict[str, Any]]) -> list[str]:
    """A node-local no-op's wall time from one control host (node_local_projection), from the bench's runs."""
    last = rows[-1]["nodelocal"]
    if last.get("corectl_cpu_s") is None:
        return []
    own = slope([(row["dgx"], row["nodelocal"]["corectl_cpu_s"]) for row in rows])
    total = slope([(row["dgx"], row["nodelocal"]["cpu_s"]) for row in rows])
    return node_local_projection(last["services_s"], last["node_job_s"], own, total)


def node_local_projection(services_s: float, node_job_s: float, own: float, total: float) -> list[str]:
    """A node-local no-op's wall time from one control host: the service nodes' plays (``services_s``), then the
    node jobs (``node_job_s`` each) ``parallel`` at a time (32, the default, and every node at once), unless the
    control host's CPU is slower: corectl's own process (``own`` CPU-s per node on one core: its threads share
    Python's lock; the processes that follow the node jobs, node_local.processes, are its children and count in the
    rest) or all of its work (``total`` CPU-s per node) over PROJECT_CORES cores."""
    lines = [
        "",
        f"node-local no-op, wall time from one {PROJECT_CORES}-core control host (services {services_s} s, "
        f"a node's job {node_job_s} s; corectl's own {own:.3f} CPU-s per DGX on one core, {total:.3f} "
        "CPU-s per DGX in all), with node_local.parallel 32 | every node at once:",
    ]
    for n in PROJECT_NODES:
        cells = []
        for parallel in (32, n):
            jobs = services_s + -(-n // parallel) * node_job_s
            bound = max(jobs, own * n, total * n / PROJECT_CORES)
            why = "node jobs" if bound == jobs else "corectl's one core" if bound == own * n else "control-host CPU"
            cells.append(f"{duration(bound)} (bound by {why})")
        lines.append(f"  {n:>6,d} nodes: {' | '.join(cells)}")
    return lines


def write_doc(text: str, argv: list[str]) -> bool:
    """Put the table between docs/performance.md's bench markers; False when they are missing."""
    doc = DOC.read_text(encoding="utf-8")
    begin, end = doc.find(DOC_BEGIN), doc.find(DOC_END)
    if begin < 0 or end < begin:
        return False
    command = "make bench" + (f' BENCH_ARGS="{" ".join(argv)}"' if argv else "")
    block = (
        f"{DOC_BEGIN}\nWritten by `{command}` (bench/fleet.py); run the same command to reproduce it.\n\n"
        f"```\n{text}\n```\n"
    )
    DOC.write_text(doc[:begin] + block + doc[end:], encoding="utf-8")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4,8", help="DGX stand-ins per no-op step, ascending")
    parser.add_argument("--full-dgx", type=int, default=2, help="DGX stand-ins in the full provision's fresh lab")
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument("--keep", action="store_true", help="leave the bench lab running")
    options = parser.parse_args()
    sizes = sorted(int(s) for s in options.sizes.split(","))
    only = set(options.only.split(","))
    results: dict[str, Any] = {"sizes": sizes}
    if "render" in only:
        results["render"] = bench_render()
    if only & {"full", "noop", "addnode"}:
        results.update(bench_lab(sizes, options.full_dgx, only, options.keep))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    text = report(results)
    (ROOT / "build" / "bench.txt").write_text(text + "\n")
    print(text)
    print(f"\n(results: {RESULTS.relative_to(ROOT)}, build/bench.txt)")
    if only >= set(PARTS):  # a partial run never replaces the whole table
        written = write_doc(text, [a for a in sys.argv[1:] if a != "--keep"])
        print(f"({DOC.relative_to(ROOT)}: {'table written' if written else 'no bench markers, not written'})")


if __name__ == "__main__":
    main()
