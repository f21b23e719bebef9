"""A cluster in a box for the tests: hosts login, n1, n2, n3 and an intruder as network namespaces, with a Slurm of
their own (scripts/cluster_box.py), built once per session and removed after it, even when a test failed.

The test modules import these fixtures by name (``from box_fixtures import ...``), as tests/slurm does: a conftest.py
here would be imported as ``conftest`` too and shadow tests/conftest.py.

Where namespaces cannot be made (not root, not Linux, a sandbox that forbids them, no tools and no apt-get) every
test here skips, saying why; as root (CI) a box that cannot be built is an error, never a skip. The box takes
/tmp/ddp_box.lock for the session (or uses the one an enclosing ``flock /tmp/ddp_box.lock pytest ...`` holds).
"""
from __future__ import annotations

import os
import re
import signal
import shutil
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A DDP training the box tests run on every launcher (each adds its last expression): different starting weights, which
# DDP's broadcast makes one, three steps, the weights in w.
DDP_TRAIN = """
import os, socket, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(dist.get_rank())  # different starting weights: DDP's broadcast makes them one
m = DDP(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad(); m(torch.randn(8, 4)).sum().backward(); opt.step()
w = torch.cat([p.detach().flatten() for p in m.parameters()])
"""
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

import box_ray  # noqa: E402
import box_ssh  # noqa: E402
import cluster_box  # noqa: E402
from kernel_helper import Kernel  # noqa: E402

from ddp_magic.kernel.templates import WARM_ENV  # noqa: E402

TIMINGS: dict = {}  # up_s, down_s of this session's box (the report reads them)


def _cannot() -> str:
    """Why a box cannot be had here at all; "" when it can (or when root should be able to, and a failure is an error)."""
    why = cluster_box.missing()
    if why is None:
        return ""
    if "needs root" in why or "needs Linux" in why or "cannot be made" in why:
        return why
    if not shutil.which("apt-get"):
        return why + "; and there is no apt-get to install it"
    return ""


_SHARED: dict = {}  # the one box and the one warm kernel of the session, however many modules alias the fixtures


@pytest.fixture(scope="session")
def box() -> Iterator[cluster_box.Box]:
    """The session's box, up (Slurm nodes idle); removed after the session whatever happened. Each test module that
    names this fixture gets its own session-scoped copy from pytest: they share one box (counted), and the last one
    to go removes it, after the shared kernel."""
    why = _cannot()
    if why:
        pytest.skip(f"no cluster in a box: {why}")
    if "box" not in _SHARED:
        b = cluster_box.Box()
        t0 = time.monotonic()
        try:
            b.up()  # raises (an error, not a skip) when root cannot build it
        except BaseException:
            b.down()
            raise
        TIMINGS["up_s"] = time.monotonic() - t0
        _SHARED.update(box=b, box_users=0)
    _SHARED["box_users"] += 1
    try:
        yield _SHARED["box"]
    finally:
        _SHARED["box_users"] -= 1
        if _SHARED["box_users"] == 0:
            _end_kernel()
            b = _SHARED.pop("box")
            t1 = time.monotonic()
            b.down()
            TIMINGS["down_s"] = time.monotonic() - t1
            print(f"\ncluster box {b.prefix}: up in {TIMINGS['up_s']:.1f} s, down in {TIMINGS['down_s']:.1f} s", file=sys.stderr)


def kernel_env(b: cluster_box.Box, **extra: str) -> dict:
    """A box kernel's env: the box's Slurm, this checkout first on the path of the kernel and of every rank it starts."""
    env = dict(b.env(), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])))
    env[WARM_ENV] = "0"  # its pools are the box's hosts': a local template warmed at %load_ext would cost each kernel CPU for nothing
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env.update(extra)
    return env


def login_kernel(b: cluster_box.Box, **extra: str) -> Kernel:
    """A real kernel on the box's login host, ddp_magic loaded; the caller shuts it down."""
    k = Kernel(extra_env=kernel_env(b, **extra), prefix=b.enter("login", cwd=str(ROOT)))
    try:
        k.run("%load_ext ddp_magic").ok()
    except BaseException:
        k.shutdown()
        raise
    return k


@pytest.fixture(scope="session")
def box_kernel(box: cluster_box.Box) -> Iterator[Kernel]:
    """One warm kernel on login for the session's tests (each test leaves it with no pool: ``%ddp stop``), shared
    like the box; it goes before the box does."""
    if "kernel" not in _SHARED:
        _SHARED.update(kernel=login_kernel(box), kernel_users=0)
    _SHARED["kernel_users"] += 1
    try:
        yield _SHARED["kernel"]
    finally:
        _SHARED["kernel_users"] -= 1
        if _SHARED["kernel_users"] == 0:
            _end_kernel()


def _end_kernel() -> None:
    k = _SHARED.pop("kernel", None)
    if k is not None:
        k.shutdown()


@pytest.fixture(scope="module")
def ray_box(box: cluster_box.Box) -> Iterator[box_ray.Cluster]:
    """A Ray cluster in the box (a head on login with no CPU, n1 and n2 with 2 CPUs and 2 fake GPUs each, token
    authentication on), for one module's tests, stopped by its own pids (never ``ray stop``: scripts/box_ray.py)."""
    why = box_ray.missing()
    if why:
        pytest.skip(f"no Ray here: {why}")
    cluster = box_ray.in_box(box)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def ssh_login(box: cluster_box.Box, tmp_path: Path) -> Iterator[box_ssh.Login]:
    """This test's own login to the box's sshds: a key authorised on every node for the test, a known_hosts with each
    node's real key, an ssh config naming n1, n2 (through a ProxyJump over n1) and n3. Skips where the box has no sshd."""
    if box.ssh_missing:
        pytest.skip(f"no sshd in the box: {box.ssh_missing}")
    login = box_ssh.Login.make(box, str(tmp_path / "ssh"))
    try:
        yield login
    finally:
        login.forget(box)


@pytest.fixture
def debian_hosts(box: cluster_box.Box) -> Iterator[str]:
    """Every host's /etc/hosts in Debian's style (own name -> 127.0.1.1) for one test; back to names that resolve after."""
    box.hosts_style("debian")
    try:
        yield "debian"
    finally:
        box.hosts_style("resolve")


# what a kept pool's tests run after rank 3 (on n2, a following template's host) died: forked again there, once
KEPT_AGAIN = ("%%ddp\nimport os, socket, torch, torch.distributed as dist\nx = torch.ones(1) * (dist.get_rank() + 1)\n"
         "dist.all_reduce(x)\nhad = globals().get('kept')\nkept = 100 + dist.get_rank()\n(had, x.item(), socket.gethostname(), os.getpid())")


def kept_rank_recovers(k: Kernel, ranks: "list[int]") -> None:
    """Rank 3 (on n2, a following template's node or host) killed: forked again there by n2's template, through the
    lease; twice right. Its ``kept`` differs by rank: the heal names it, the first cell sees None there."""
    os.kill(ranks[3], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not re.search(r"rank 3: pid \d+ +dead", k.run("%ddp status").stdout):
        time.sleep(0.2)
    for run in range(2):
        ex = k.run(KEPT_AGAIN, timeout=180).ok()
        values = k.value("[tuple(v) for v in _]")
        assert all(v[1] == 10.0 for v in values) and [v[2] for v in values] == ["n1", "n1", "n2", "n2"], values
        if run == 0:
            assert "started it again" in ex.stdout and "rank 3" in ex.stdout, ex.stdout
            assert [v[0] for v in values] == [100, 101, 102, None], values
            assert values[3][3] != ranks[3]
        else:
            assert [v[0] for v in values] == [100, 101, 102, 103], values
