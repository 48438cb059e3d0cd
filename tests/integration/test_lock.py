"""The site lock: one changing command per site, a clear refusal, --wait, and stale locks taken over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from corectl import lock
from corectl.errors import CorectlError
from corectl.site import Site

CORECTL = str(Path(sys.executable).parent / "corectl")


@pytest.fixture
def site(prod_copy: Path, root: Path) -> Site:
    return Site(root=root, directory=prod_copy)


def test_second_holder_is_refused_with_the_holder_named(site: Site):
    with lock.site_lock(site, "provision --inventory prod", warn=pytest.fail), pytest.raises(CorectlError) as refused:
        lock.acquire(site, "drain dgx01", warn=pytest.fail)
    assert refused.value.exit_code == 75
    message = str(refused.value)
    assert message.startswith("site prod is busy: `corectl provision --inventory prod` by ")
    assert f"(pid {os.getpid()}, since " in message
    assert message.endswith(f" holds {site.directory / '.lock'}; try again when it ends, or give --wait SECONDS")
    # released: the file names nobody, and the next command gets the lock at once
    assert (site.directory / ".lock").read_text() == ""
    lock.acquire(site, "drain dgx01", warn=pytest.fail).release()


def test_the_holder_records_the_run_it_is_in(site: Site):
    with lock.site_lock(site, "provision", warn=pytest.fail):
        lock.note_run(site.runs_dir / "20260101T000000Z-1")
        holder = json.loads((site.directory / ".lock").read_text())
    assert holder["command"] == "provision"
    assert holder["pid"] == os.getpid()
    assert holder["run"] == str(site.runs_dir / "20260101T000000Z-1")


def test_wait_takes_the_lock_once_the_holder_ends(site: Site):
    held = lock.acquire(site, "upgrade drivers", warn=pytest.fail)
    timer = threading.Timer(1.0, held.release)
    timer.start()
    started = time.monotonic()
    try:
        lock.acquire(site, "add-node dgx13", wait=30, warn=pytest.fail).release()
    finally:
        timer.cancel()
    assert time.monotonic() - started >= 0.9  # it did wait for the release


def test_wait_gives_up_after_its_time(site: Site):
    busy = r"^site prod is busy \(waited 1s\): `corectl upgrade drivers`"
    with lock.site_lock(site, "upgrade drivers", warn=pytest.fail), pytest.raises(CorectlError, match=busy):
        lock.acquire(site, "add-node dgx13", wait=1, warn=pytest.fail)


def test_a_lock_left_by_a_killed_process_is_taken_over_with_a_warning(site: Site):
    # a corectl killed with SIGKILL: the kernel dropped its lock, its holder record stayed
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from corectl import lock; from corectl.site import Site; "
         "lock.acquire(Site(Path(sys.argv[1]), Path(sys.argv[2])), 'provision'); print('held', flush=True); "
         "time.sleep(600)",
         str(site.root), str(site.directory)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None and child.stdout.readline() == "held\n"
    with pytest.raises(CorectlError, match="is busy"):
        lock.acquire(site, "drain dgx01", warn=pytest.fail)
    child.kill()
    child.wait()
    warnings: list[str] = []
    lock.acquire(site, "drain dgx01", warn=warnings.append).release()
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: taking over the lock of site prod left by `corectl provision` by ")
    assert f"(pid {child.pid}, since " in warnings[0]


def test_cli_refuses_a_changing_command_and_never_blocks_a_reading_one(site: Site):
    hosts = site.hosts_file
    hosts.unlink(missing_ok=True)
    with lock.site_lock(site, "provision --inventory prod", warn=pytest.fail):
        render = subprocess.run([CORECTL, "render", "--inventory", str(site.directory)],
                                capture_output=True, text=True, check=False)  # fmt: skip
        validate = subprocess.run([CORECTL, "validate", "--inventory", str(site.directory)],
                                  capture_output=True, text=True, check=False)  # fmt: skip
    assert render.returncode == 75
    [line] = render.stderr.splitlines()
    assert line.startswith("error: site prod is busy: `corectl provision --inventory prod` by ")
    assert not hosts.exists()  # refused before anything was written
    assert validate.returncode == 0, validate.stderr
