"""corectl.drain_reason: the one format and parse of corectl's drain reasons, its shipped link, its command line
(the health hook's), and no other file of the project spelling a reason's prefix."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
from zipapps import ZIPAPPS

from corectl.drain_reason import MAX_LENGTH, PREFIX, DrainReason, Source, source_of

MODULE = ROOT / "src" / "corectl" / "drain_reason.py"
SHIPPED = ROOT / "roles" / "slurm" / "files" / "corectl_drain_reason.py"


XID_MESSAGE = "Xid 79 on GPU 3\n(fell off the bus)"
BUSBW = "bus bandwidth 117.6 GB/s < expected 450 GB/s"
PAIR = "nccl-pair: 80 GB/s (with dgx02)"
EPILOG = "job 12 left pid 4242 (python) on GPU 3"


@pytest.mark.parametrize(
    ("reason", "text", "check"),
    [
        (DrainReason.health("xid", XID_MESSAGE), "corectl-health: xid: Xid 79 on GPU 3 (fell off the bus)", "xid"),
        (DrainReason.service("xid"), "corectl: needs hardware service (xid)", "xid"),
        (DrainReason(Source.VALIDATION, "nccl", BUSBW), f"corectl validation: nccl: {BUSBW}", "nccl"),
        # a validation message that names its check itself
        (DrainReason(Source.VALIDATION, message=PAIR), f"corectl validation: {PAIR}", "nccl-pair"),
        (DrainReason.burn_in(BUSBW), f"corectl burn-in: {BUSBW}", "nccl"),
        (DrainReason.epilog(EPILOG), f"corectl-epilog: {EPILOG}", ""),
    ],
)
def test_each_source_writes_its_one_format_and_reads_it_back(reason: DrainReason, text: str, check: str):
    assert str(reason) == text
    back = DrainReason.parse(text)
    assert back is not None and (back.source, back.check) == (reason.source, check)
    assert DrainReason.parse(f"{text} [root@2026-11-26T09:02:11]") == back  # as scontrol shows it


def test_what_slurm_keeps_of_a_reason_is_read_as_corectl_wrote_it():
    """The hook's reason of a check that printed nothing loses its last space in Slurm; a check the hook named
    after its file may be any name; reasons are cut at MAX_LENGTH, the hook's message at 200 characters."""
    assert DrainReason.parse("corectl-health: 50_site.sh:") == DrainReason(Source.HEALTH, "50_site.sh", "")
    assert DrainReason.parse("corectl-health: gpu-count: 7 GPUs, expected 8") == DrainReason(
        Source.HEALTH, "gpu-count", "7 GPUs, expected 8"
    )
    assert len(str(DrainReason.burn_in("x" * 400))) == MAX_LENGTH
    assert str(DrainReason.health("ecc", "y" * 400)) == "corectl-health: ecc: " + "y" * 200
    assert DrainReason.burn_in("slow").check == "nccl"  # burn-in runs the checker's nccl check


@pytest.mark.parametrize(
    "reason",
    ["", "corectl drain", "corectl remove-node", "Not responding", "Kill task failed", "corectl-healthy", "corectl:"],
)
def test_a_reason_corectl_did_not_write_is_none(reason: str):
    assert DrainReason.parse(reason) is None and source_of(reason) is None


def test_the_shipped_module_is_this_one_and_answers_the_hook():
    """Role slurm ships the link's target (the files module follows it); the hook formats a failure and asks
    whose a reason is with it, in the node's python3 (stdlib only)."""
    assert SHIPPED.is_symlink() and SHIPPED.resolve() == MODULE.resolve()

    def hook(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-I", str(SHIPPED), *argv], capture_output=True, text=True, check=False)

    formatted = hook("format", "health", "ecc", "2 uncorrectable\nerrors")
    assert (formatted.returncode, formatted.stdout) == (0, "corectl-health: ecc: 2 uncorrectable errors\n")
    assert hook("source", "corectl-health: ecc: x [root@2026-11-26T09:02:11]").stdout == "health\n"
    assert hook("source", "corectl: needs hardware service (xid)").stdout == "service\n"
    other = hook("source", "an operator's maintenance")
    assert (other.returncode, other.stdout) == (1, "")
    assert hook("nonsense").returncode == 2


def spelled(path: Path) -> list[str]:
    """The prefixes a file spells in its code: Python's string constants but docstrings, other files' lines but
    comments."""
    prefixes = [prefix.strip() for prefix in PREFIX.values()]
    text = path.read_text(errors="replace")
    if path.suffix == ".py" or text.startswith("#!/usr/bin/python") or text.startswith("#!/usr/bin/env python"):
        tree = ast.parse(text)
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        strings = [
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
        ]
    else:
        strings = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return sorted({prefix for prefix in prefixes for s in strings if prefix in s})


def test_no_other_file_spells_a_reason_prefix():
    """One format: the prefixes are written in corectl.drain_reason only (alert texts and comments may name them)."""
    sources = [
        *(ROOT / "src").rglob("*.py"),
        *(ROOT / "collections").rglob("*.py"),
        *(ROOT / "playbooks").glob("*.yml"),
        *(p for p in (ROOT / "roles").rglob("*") if p.is_file() and not p.is_symlink() and "/files/" in str(p)),
        *(ROOT / "roles").rglob("*.j2"),
        *(ROOT / "roles").rglob("tasks/*.yml"),
    ]
    zipapps = {ROOT / app.target for app in ZIPAPPS}  # built from packages scanned here (tools/zipapps.py)
    found = {
        str(path.relative_to(ROOT)): spelled(path)
        for path in sources
        if path.resolve() != MODULE.resolve()
        and path.suffix not in (".json", ".c")
        and path not in zipapps
        and spelled(path)
    }
    assert found == {}
