"""Hostile cluster.yml files: each ends in a clean file:line error (exit 2), never in a traceback,
a hang, code run by Ansible's templating or an extra line in a generated file.

tests/corpus/NN-*.yml are small sites with one fault each; line 1 says what must be reported:
``# expect: <dotted.path>: <a word of the message>``. Each goes through the CLI's validate command
(in this process, SIGALRM after 10 s as the hang guard; one of each kind also through a fresh
interpreter with a 10 s timeout). tests/corpus/valid.yml is the same kind of site
with legitimate values for every strictly checked field, and must stay valid.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import ROOT
from corectl import hostlist
from corectl.cli import app
from corectl.errors import ValidationFailed
from corectl.site import yamlsrc
from corectl.site.loader import MAX_PROBLEMS, load_cluster
from corectl.site.render import render_text
from corectl.site.yamlsrc import MAX_BYTES, MAX_WRITTEN

CORPUS = ROOT / "tests" / "corpus"
CASES = sorted(CORPUS.glob("[0-9][0-9]-*.yml"))
EXPECT = re.compile(r"^# expect: (?P<path>\S+): (?P<word>.+)$")
ERROR_LINE = re.compile(r"^(?P<file>\S+cluster\.yml):(?P<line>\d+): (?P<path>\S+): (?P<message>.+)$")
TIMEOUT = 10
Result = tuple[subprocess.CompletedProcess[str], float]


def _validate(site: Path) -> Result:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "corectl.cli", "validate", "--inventory", str(site)],
        capture_output=True,
        text=True,
        errors="replace",
        cwd=ROOT,
        timeout=TIMEOUT,
        check=False,
    )
    return proc, time.monotonic() - start


def _site_with(directory: Path, content: bytes) -> Path:
    directory.mkdir(parents=True)
    (directory / "cluster.yml").write_bytes(content)
    return directory


def _validate_here(site: Path) -> Result:
    """The CLI's validate command in this process (the real typer app and its error handling),
    with SIGALRM as the hang guard."""

    def hung(_signum: int, _frame: object) -> None:
        raise TimeoutError(f"validate gave no answer in {TIMEOUT} s")

    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(TIMEOUT)
    try:
        result = CliRunner().invoke(app, ["validate", "--inventory", str(site)])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += f"\nTraceback (raised in process): {result.exception!r}"
    proc = subprocess.CompletedProcess(["corectl", "validate"], result.exit_code, result.stdout, stderr)
    return proc, time.monotonic() - start


@pytest.fixture(scope="module")
def corpus_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    """Every corpus file through the CLI's validate command once, in this process (a handful also
    go through a fresh interpreter below)."""
    base = tmp_path_factory.mktemp("corpus")
    sites = {case.stem: _site_with(base / case.stem, case.read_bytes()) for case in CASES}
    done = {name: _validate_here(site) for name, site in sites.items()}
    slowest = max(done, key=lambda name: done[name][1])
    print(f"\nslowest corpus file: {slowest} ({done[slowest][1]:.2f} s)")
    return done


def _assert_clean_failure(proc: subprocess.CompletedProcess[str]) -> list[re.Match[str]]:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output, output
    lines = proc.stderr.splitlines()
    assert lines, output
    parsed = [ERROR_LINE.match(line) for line in lines]
    assert all(parsed), lines
    return [m for m in parsed if m is not None]


def test_corpus_is_large_enough():
    assert len(CASES) >= 40
    assert len({case.name[:2] for case in CASES}) == len(CASES), "two corpus files share a number"


# one pytest-xdist worker for every test of corpus_results, so that it runs once (tests/conftest.py)
@pytest.mark.xdist_group("corpus_results")
@pytest.mark.parametrize("case", CASES, ids=[case.stem for case in CASES])
def test_corpus_file_fails_with_one_clean_line_per_problem(case: Path, corpus_results):
    first = case.read_bytes().split(b"\n", 1)[0].decode()
    expected = EXPECT.match(first)
    assert expected, f"{case.name}: line 1 must be '# expect: <path>: <word>'"
    proc, _ = corpus_results[case.stem]
    found = _assert_clean_failure(proc)
    ours = [m for m in found if m["path"] == expected["path"]]
    assert ours, f"no error for {expected['path']}: {proc.stderr}"
    assert any(expected["word"] in m["message"] for m in ours), proc.stderr


# one of each kind through a fresh interpreter, as an operator runs corectl
THROUGH_THE_BINARY = [
    "01-alias-bomb",
    "23-bad-utf8",
    "36-jinja-environment",
    "61-jump-host-port-range",
    "82-ssh-key-options-prefix",
]


@pytest.mark.parametrize("name", THROUGH_THE_BINARY)
def test_corpus_sample_through_a_fresh_interpreter(name: str, tmp_path: Path):
    case = CORPUS / f"{name}.yml"
    expected = EXPECT.match(case.read_bytes().split(b"\n", 1)[0].decode())
    assert expected
    proc, _ = _validate(_site_with(tmp_path / "site", case.read_bytes()))
    found = _assert_clean_failure(proc)
    assert any(m["path"] == expected["path"] and expected["word"] in m["message"] for m in found), proc.stderr


@pytest.mark.parametrize("case", CASES, ids=[case.stem for case in CASES])
def test_corpus_without_the_libyaml_screen(case: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Without libyaml (or past a syntax error libyaml stops at) ruamel's own events are guarded:
    the same problem is reported."""
    monkeypatch.setattr(yamlsrc, "_screen", lambda text: False)
    expected = EXPECT.match(case.read_bytes().split(b"\n", 1)[0].decode())
    assert expected
    site = _site_with(tmp_path / "site", case.read_bytes())
    with pytest.raises(ValidationFailed) as failed:
        load_cluster(site)
    found = [ERROR_LINE.match(line) for line in failed.value.lines]
    assert all(found), failed.value.lines
    assert any(m["path"] == expected["path"] and expected["word"] in m["message"] for m in found if m)


VALID = (CORPUS / "valid.yml").read_text()
LAST = VALID.count("\n")  # lines of valid.yml


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        # over the size limit: refused before it is read
        (VALID + "# padding\n" * (MAX_BYTES // 10 + 1), 1, f"larger than {MAX_BYTES // 2**20} MiB"),
        # a flat list of more values than a real site has: refused by the fast (libyaml) pass
        (VALID + "extra: [" + "0, " * (MAX_WRITTEN + 10) + "0]\n", LAST + 1, f"more than {MAX_WRITTEN:,} values"),
        # a second document after a long first one
        ("#\n" * 20_000 + VALID + "---\n{}\n", 20_000 + LAST + 1, "second YAML document"),
    ],
    ids=["huge-file", "too-many-values", "late-second-document"],
)
def test_generated_hostile_files(tmp_path: Path, text: str, line: int, words: str):
    site = _site_with(tmp_path / "site", text.encode())
    proc, _ = _validate(site)
    found = _assert_clean_failure(proc)
    assert [(m["path"], int(m["line"]), words in m["message"]) for m in found] == [("(yaml)", line, True)], found


def test_hostlist_refuses_huge_ranges_without_building_them():
    with pytest.raises(hostlist.TooManyNames, match="100,000"):
        hostlist.expand("dgx[1-99999999999]")
    with pytest.raises(hostlist.TooManyNames):
        hostlist.expand("a[1-60000],b[1-60000]")
    with pytest.raises(hostlist.HostlistError, match="bad range"):
        hostlist.expand("dgx[" + "9" * 5000 + "]")
    assert len(hostlist.expand("n[1-10]", limit=10)) == 10
    with pytest.raises(hostlist.TooManyNames):
        hostlist.expand("n[1-11]", limit=10)
    with pytest.raises(hostlist.HostlistError, match=r"255\.255\.255\.255"):
        hostlist.expand_addresses("255.255.255.250", 10)
    with pytest.raises(hostlist.HostlistError, match="more than 3 addresses"):
        hostlist.expand_addresses("10.0.0.[1-99999999999]", 3)


def test_problems_are_capped_with_a_count_of_the_rest(tmp_path: Path):
    users = "".join(f"  - name: u{i}\n    uid: {i}\n    group: research\n" for i in range(MAX_PROBLEMS + 50))
    site = _site_with(tmp_path / "many", VALID.replace("users:\n", "users:\n" + users, 1).encode())
    with pytest.raises(ValidationFailed) as failed:
        load_cluster(site)
    lines = failed.value.lines
    assert len(lines) == MAX_PROBLEMS + 1
    assert all(ERROR_LINE.match(line) for line in lines)
    assert lines[-1].endswith(": (document): 50 more problems not shown (fix these first)")


def test_a_long_chain_of_switches_is_checked_without_recursion(tmp_path: Path):
    chain = "".join(f"    - name: s{i}\n      switches: [s{i + 1}]\n" for i in range(3000))
    text = VALID.replace("fabric:\n  switches:\n", "fabric:\n  switches:\n" + chain + "    - name: s3000\n", 1)
    site = _site_with(tmp_path / "chain", text.encode())
    with pytest.raises(ValidationFailed) as failed:
        load_cluster(site)
    assert not any("form a loop" in line for line in failed.value.lines)
    assert any("leaf switch 's3000' has no nodes" in line for line in failed.value.lines)
    looped = text.replace("    - name: s3000\n", "    - name: s3000\n      switches: [s0]\n", 1)
    (site / "cluster.yml").write_text(looped)
    with pytest.raises(ValidationFailed) as failed:
        load_cluster(site)
    assert "switches form a loop" in failed.value.lines[0]
    assert failed.value.lines[-1].endswith(
        f": (document): {3001 - MAX_PROBLEMS:,} more problems not shown (fix these first)"
    )


def test_valid_site_with_every_strict_field_passes(tmp_path: Path):
    site = _site_with(tmp_path / "valid", VALID.encode())
    proc, _ = _validate(site)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cluster = load_cluster(site)
    config = cluster.config
    assert config.cluster.ntp_servers == ["10.0.0.1", "2001:db8::123", "0.pool.ntp.org"]
    assert config.cluster.ssh.jump_host == "admin@bastion.example.org:2222,jump@[2001:db8::1]:22"
    assert config.cephfs is not None
    assert "[2001:db8::10]:3300" in config.cephfs.monitors
    assert "name=corectl" in config.cephfs.mounts[0].options
    assert [key.split()[0] for key in config.users[0].ssh_keys] == [
        "ssh-ed25519",
        "ecdsa-sha2-nistp256",
        "sk-ssh-ed25519@openssh.com",
    ]
    assert config.slurm.partitions[0].max_time == "2-00:00:00"  # written as `!!str 2-00:00:00`
    # the merge key (<<: *compute) gives dgx03 the anchored entry's rack
    assert cluster.node("dgx03").rack == "R1.2"
    hosts = yaml.safe_load(render_text(cluster))["all"]
    kex = "-o KexAlgorithms=mlkem768x25519-sha256,curve25519-sha256"
    assert hosts["vars"]["ansible_ssh_common_args"] == f"{kex} -o ProxyJump={config.cluster.ssh.jump_host}"
    assert hosts["hosts"]["dgx03"]["ansible_host"] == "2001:db8::13"


def test_the_shipped_site_still_validates():
    """inventories/prod (the lab's site is written by `corectl lab up`: the tests below validate it)."""
    assert load_cluster(ROOT / "inventories" / "prod").nodes


@pytest.mark.parametrize("ceph", [False, True])
def test_lab_site_with_a_real_ssh_key_validates(tmp_path: Path, ceph: bool):
    """The lab's cluster.yml as `corectl lab up` writes it (the end-to-end test's prefix, subnet
    and ports), with a user key made by ssh-keygen."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    from corectl.lab.inventory import write_inventory
    from corectl.lab.spec import LabSpec
    from corectl.site import Site

    key = tmp_path / "alice_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "corectl-lab-labtest-alice_ed25519", "-f", str(key)],
        check=True,
    )
    site = Site(root=ROOT, directory=tmp_path / "labtest")
    spec = LabSpec(site=site, computes=2, subnet="172.29.210.0/24", ssh_port_base=22300, prefix="e2e-", ceph=ceph)
    write_inventory(spec, user_key=key.with_suffix(".pub").read_text().strip())
    cluster = load_cluster(site.directory)
    assert [n.name for n in cluster.nodes] == ["e2e-dgx01", "e2e-dgx02", "e2e-head01"]
    assert cluster.config.users[0].ssh_keys[0].startswith("ssh-ed25519 AAAA")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("    SITE: tiny\n", "    SITE: tiny\n    NO_PROXY: 'a{b}c, 50%'\n"),
        ("    rack: r01\n    ssh:", "    rack: 01.A_b-2\n    ssh:"),
        ("    - 10.0.0.1\n", "    - ntp.example.org.\n    - fd00::1\n"),
        ("[noatime, name=corectl]", "[noatime, _netdev, x-systemd.mount-timeout=30, secretfile=/etc/ceph/x.secret]"),
        ("admin@bastion.example.org:2222", "bastion,admin@[2001:db8::2]:2222,ops_1@10.0.0.9"),
    ],
    ids=["free-text-braces", "rack", "ntp", "mount-options", "jump-chain"],
)
def test_legitimate_edge_values_pass(tmp_path: Path, old: str, new: str):
    text = (CORPUS / "01-alias-bomb.yml").read_text()
    base = text[text.index("cluster:\n") :]  # the corpus' site, without the bomb in front
    assert old in base
    site = _site_with(tmp_path / "edge", base.replace(old, new, 1).encode())
    cluster = load_cluster(site)
    assert len(cluster.nodes) == 5
