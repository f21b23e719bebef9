"""A real Slurm for the tests: two nodes (n1, n2) on this machine, started once per session, stopped after.

The test modules import these fixtures by name (``from slurm_fixtures import ...``): a conftest.py here would be
imported as ``conftest`` too and shadow tests/conftest.py, whose helpers other test modules import by that name.

scripts/local_slurm.py does the work (installs the packages as root when missing, writes
the conf for this host, starts munged, slurmctld and two slurmd, waits for sinfo). Where
it cannot (not root, no apt-get) every Slurm test skips, saying why; as root (CI) an
install or start that fails is a test error, never a skip. After each test no job of
ddp_magic's may be left in squeue.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import local_slurm  # noqa: E402

JOB_NAME = "ddp_magic"


def _cannot() -> str:
    """Why the local Slurm cannot be had here at all (not root, or nothing installed and no apt-get); "" when it can."""
    why = local_slurm.missing()
    if why is None:
        return ""
    if "needs root" in why or "needs Linux" in why:
        return why
    if why.startswith("Slurm is not installed") and not any(os.access(os.path.join(d, "apt-get"), os.X_OK) for d in os.environ.get("PATH", "").split(":")):
        return why + "; and there is no apt-get to install it"
    return ""


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[str]:
    """The local two-node Slurm, up; its description."""
    why = _cannot()
    if why:
        pytest.skip(f"no local Slurm: {why}")
    was_running = local_slurm.running()
    line = local_slurm.start()  # raises (an error, not a skip) when root cannot install or start it
    yield line
    if not was_running:
        local_slurm.stop()


def our_jobs() -> List[str]:
    """The jobs ddp_magic made that squeue still lists ("id state")."""
    done = subprocess.run(["squeue", "-h", "-n", JOB_NAME, "-o", "%i %T"], capture_output=True, text=True, timeout=20)
    return [ln.strip() for ln in done.stdout.splitlines() if ln.strip()]


def wait_no_jobs(seconds: float = 10.0) -> List[str]:
    """Wait until squeue lists no job of ours; what is left after ``seconds``."""
    deadline = time.monotonic() + seconds
    while our_jobs() and time.monotonic() < deadline:
        time.sleep(0.2)
    return our_jobs()


def cancel_our_jobs() -> None:
    """scancel every job of ours (after a test failed and left one), so the next test starts clean."""
    ids = [job.split()[0] for job in our_jobs()]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=20)
        wait_no_jobs()


@pytest.fixture
def no_jobs_left(slurm_cluster: str) -> Iterator[None]:
    """Each test starts with no job of ours and leaves none (a few seconds allowed for Slurm to purge). A test that
    leaves one fails here, and the job is cancelled, so that only that test fails, not every one after it."""
    cancel_our_jobs()  # an earlier test's leftover: that test already failed for it
    yield
    left = wait_no_jobs()
    cancel_our_jobs()
    assert left == [], f"jobs left in squeue: {left}"
