"""Failures, interrupts and bad input: nothing hangs, nothing is lost, nobody gets in — each case against real workers.

Every test prints how long recovery took (run pytest with -s, or read the
captured output in the report) so the figures can be compared across runs.
"""
from __future__ import annotations

import os
import re
import resource
import socket
import threading
import time

import pytest

from conftest import pid_alive, ranks_of, wait_until, worker_pids_of
from kernel_helper import Kernel

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def k4():
    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    k.run("%%ddp -n 4\nimport torch, torch.distributed as dist", timeout=180).ok()
    yield k
    k.shutdown()


def _timed(label: str, t0: float) -> float:
    """The seconds since ``t0``, printed (-s): a figure to read, not to bound (bench/bench_recovery.py's failures table
    measures each of these cells); the tests assert what came first."""
    took = time.monotonic() - t0
    print(f"RECOVERY {label}: {took:.2f}s")
    return took


# 1 ---------------------------------------------------------------------------
def test_rank_raises_while_others_wait_in_a_collective(k4):
    t0 = time.monotonic()
    ex = k4.run(
        "%%ddp\nx = torch.ones(1)\nif dist.get_rank() == 1:\n    raise ValueError('rank 1 cannot go on')\ndist.all_reduce(x)\nx",
        timeout=60,
    )
    _timed("rank raises, others stuck in all_reduce", t0)
    assert ex.error is not None  # ended, not held until gloo's own timeout (30 min): the run's 60 s would have raised
    msg = ex.error[1]
    assert msg.startswith("rank 1 raised ValueError: rank 1 cannot go on")
    assert "raise ValueError('rank 1 cannot go on')" in msg  # the worker's own traceback
    assert re.search(r"ranks 0, 2-3 were in all_reduce #\d+ \(at cell line 5: dist\.all_reduce\(x\)\) and were released", msg), msg
    assert "your variables are intact" in msg  # the group was re-formed in the same processes (test_recovery.py)
    t1 = time.monotonic()
    ex = k4.run("%%ddp\nimport torch.distributed as dist\ndist.get_rank()").ok()
    _timed("next cell after the re-formed group", t1)
    assert "restarted the pool" not in ex.stdout + ex.stderr
    assert k4.value("list(_)") == [0, 1, 2, 3]
    k4.run("%%ddp\nimport torch, torch.distributed as dist").ok()


# 2 ---------------------------------------------------------------------------
def test_kernel_interrupt_stops_every_rank_and_keeps_the_pool(k4):
    k4.run("%%ddp\nkept = dist.get_rank() + 100").ok()
    pids_before = _pids(k4)
    t0 = time.monotonic()
    ex = k4.run("%%ddp\nimport time\nprint('working', flush=True)\ntime.sleep(60)", timeout=60, interrupt_after=1.5)
    _timed("Ctrl-C, ranks interruptible", t0)
    assert ex.error is not None and "interrupted" in ex.error[1]
    assert "KeyboardInterrupt" in ex.error[1] and "time.sleep(60)" in ex.error[1]
    # The ranks stopped working (not just the waiting), and kept their state.
    k4.run("%%ddp\nkept").ok()
    assert k4.value("list(_)") == [100, 101, 102, 103]
    assert _pids(k4) == pids_before


def test_rank_ignoring_the_interrupt_is_escalated(k4):
    t0 = time.monotonic()
    ex = k4.run(
        "%%ddp\nimport time\nwhile True:\n    try:\n        time.sleep(0.05)\n    except KeyboardInterrupt:\n        print('ignoring Ctrl-C', flush=True)",
        timeout=60,
        interrupt_after=1.0,
    )
    _timed("Ctrl-C, ranks ignore it (SIGTERM escalation)", t0)
    assert ex.error is not None
    assert "did not respond to the interrupt" in ex.error[1] and "SIGTERM" in ex.error[1]
    assert "ignoring Ctrl-C" in ex.stdout
    ex = k4.run("%%ddp\nimport torch, torch.distributed as dist\ndist.get_world_size()").ok()
    assert "restarted the pool" in ex.stdout  # a notice: stdout


# 3 ---------------------------------------------------------------------------
def test_timeout_shows_every_rank_stack(k4):
    t0 = time.monotonic()
    ex = k4.run(
        "%%ddp --timeout 2\nimport time\ndef inner_work(r):\n    time.sleep(60 if r else 61)\ninner_work(dist.get_rank())",
        timeout=60,
    )
    took = _timed("--timeout 2 with every rank sleeping", t0)
    assert took >= 2, "ended after the timeout, not before"
    msg = ex.error[1]
    assert msg.startswith("the cell ran past --timeout 2s")
    assert "--- ranks 0-3 ---" in msg, "every rank stands in the same line: its stack is said once, with its ranks"
    assert msg.count("in inner_work") >= 1 and "time.sleep(60 if r else 61)" in msg
    k4.run("%%ddp\ndist.get_rank()").ok()  # interruptible ranks: the pool is still usable


# 4 ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "how, expect",
    [
        ("os._exit(7)", "exited with code 7"),
        ("os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
        ("ctypes.string_at(0)", "killed by SIGSEGV"),
        ("os.abort()", "killed by SIGABRT"),
    ],
)
def test_dying_rank_is_reported_with_its_last_lines(k4, how, expect):
    t0 = time.monotonic()
    ex = k4.run(
        "%%ddp\nimport os, signal, ctypes, time, torch.distributed as dist\n"
        "print('step 1 done', flush=True)\n"
        "if dist.get_rank() == 2:\n"
        "    print('last words of rank 2', flush=True)\n"
        f"    {how}\n"
        "dist.barrier()",
        timeout=60,
    )
    _timed(f"rank dies ({how})", t0)
    msg = ex.error[1]
    assert msg.startswith("rank 2 (pid "), msg
    assert expect in msg
    assert "last words of rank 2" in msg  # in the report
    assert "[rank 2] last words of rank 2" in ex.stdout  # and output before death was not lost
    ex = k4.run("%%ddp\nimport torch, torch.distributed as dist\ndist.get_rank()").ok()
    assert k4.value("list(_)") == [0, 1, 2, 3]


def test_out_of_memory_in_a_rank_is_an_error_not_a_hang(k4):
    # A real OOM kill cannot be provoked safely here (it is a SIGKILL, covered above);
    # an allocation past a memory limit is the other way a rank runs out of memory.
    ex = k4.run(
        "%%ddp\nimport resource\nif dist.get_rank() == 3:\n"
        "    resource.setrlimit(resource.RLIMIT_AS, (2**34, resource.getrlimit(resource.RLIMIT_AS)[1]))\n"
        "    x = bytearray(2**35)\n'ok'",
        timeout=60,
    )
    assert ex.error is not None and "rank 3 raised MemoryError" in ex.error[1]


# 5 ---------------------------------------------------------------------------
def test_kernel_restart_ends_every_worker():
    k = Kernel()
    try:
        k.run("%load_ext ddp_magic").ok()
        k.run("%%ddp -n 2\n1", timeout=180).ok()
        workers = worker_pids_of(k.pid)
        assert len(workers) >= 3
        t0 = time.monotonic()
        k.km.restart_kernel(now=True)
        gone = wait_until(lambda: not any(pid_alive(p) for p in workers), 10)
        _timed("kernel restart, workers gone", t0)
        assert gone
    finally:
        k.shutdown()


def test_stop_touches_only_our_processes(k4):
    # A process that looks like ours by name but is not ours survives %ddp stop.
    import subprocess
    import sys

    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "ddp_magic.procs.worker", "ddp_magic.procs.forkserver"])
    try:
        k4.run("%ddp stop").ok()
        time.sleep(0.5)
        assert decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()
    k4.run("%%ddp -n 4\nimport torch, torch.distributed as dist", timeout=180).ok()


# 6 ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, needle",
    [
        ("-n 0", "1 or more"),
        ("-n -3", "1 or more"),
        ("-n lots", "not a whole number"),
        ("--frobnicate", "unrecognized arguments: --frobnicate"),
        ("-n 2 --backend nccl", "needs NVIDIA GPUs"),
        ("-n 2 --backend carrier-pigeon", "invalid choice"),
        ("-n 2 --master-addr no-such-host.invalid", "does not resolve"),
        ("-n 2 --master-port 70000", "not a TCP port"),
    ],
)
def test_bad_input_is_a_short_error_that_spawns_nothing(line, needle):
    k = _fresh_kernel()
    ex = k.run(f"%%ddp {line}\n1")
    assert ex.error is not None and ex.error[0] == "UsageError", ex.error
    assert needle in ex.error[1]
    assert len(ex.error[1].splitlines()) <= 8, "short, not a wall of text"
    assert ranks_of(k.pid) == []


def test_privileged_port_message(monkeypatch):
    import errno

    from ddp_magic.errors import PlanError
    from ddp_magic.plan import net

    class Sock:
        def __init__(self, *a):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def bind(self, addr):
            raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(net.socket, "socket", Sock)
    with pytest.raises(PlanError, match="privileged"):
        net.validate_master_port("127.0.0.1", 80)


def test_enormous_output_line_is_shown_in_pieces(k4):
    ex = k4.run("%%ddp --ranks 0\nimport sys\nsys.stdout.write('x' * 5_000_000)\nsys.stdout.flush()\nprint('|end')", timeout=120).ok()
    ranks_lines = "".join(ln for ln in ex.stdout.splitlines() if ln.startswith("[rank 0]"))  # not a notice (ddp_magic: …)
    assert ranks_lines.count("x") == 5_000_000
    assert "|end" in ex.stdout
    assert max(len(line) for line in ex.stdout.splitlines()) <= 70_000


def test_worker_that_cannot_import_torch(tmp_path):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('this torch is broken on purpose')\n")
    k = Kernel(extra_env={"PYTHONPATH": str(tmp_path)})
    try:
        k.run("%load_ext ddp_magic").ok()
        ex = k.run("%%ddp -n 2\n1", timeout=60)
        assert ex.error is not None and ex.error[0] == "StartError"
        assert "this torch is broken on purpose" in ex.error[1]
        assert "pip install torch" in ex.error[1]
        assert wait_until(lambda: worker_pids_of(k.pid) == [], 5)
    finally:
        k.shutdown()


# 7 ---------------------------------------------------------------------------
def test_two_notebooks_have_separate_pools():
    a, b = Kernel(), Kernel()
    try:
        for k in (a, b):
            k.run("%load_ext ddp_magic").ok()
            k.run("%%ddp -n 2\nimport os\n(os.getpid(), os.environ['MASTER_PORT'])", timeout=180).ok()
        pa = a.value("[tuple(v) for v in _]")
        pb = b.value("[tuple(v) for v in _]")
        assert {p for p, _ in pa}.isdisjoint({p for p, _ in pb})
        assert pa[0][1] != pb[0][1], "each pool has its own MASTER_PORT"
        assert set(worker_pids_of(a.pid)).isdisjoint(worker_pids_of(b.pid))
        a.run("%ddp stop").ok()
        b.run("%%ddp\nimport os\nos.getpid()").ok()
        assert [p for p, _ in pb] == b.value("list(_)")
    finally:
        a.shutdown()
        b.shutdown()


# 8 ---------------------------------------------------------------------------
def test_stranger_cannot_run_code_and_pool_keeps_working(tmp_path):
    from ddp_magic.kernel.pool import Pool

    marker = tmp_path / "pwned"
    evil = _evil_pickle(marker)
    pool = Pool(2)
    seen_port = []
    stop = threading.Event()

    def stranger():
        while not stop.is_set():
            port = getattr(pool, "control_port", None)
            if port:
                seen_port.append(port)
                for payload in (evil, b"DDPM1" + os.urandom(64) + evil):
                    try:
                        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                            s.sendall(payload)
                            s.recv(100)
                    except OSError:
                        pass
            time.sleep(0.001)

    t = threading.Thread(target=stranger, daemon=True)
    t.start()
    try:
        pool.start()
        stop.set()
        t.join(2)
        assert seen_port, "the stranger never saw the control port"
        assert pool.rejected_peers >= 1
        assert not marker.exists(), "a stranger's pickle was loaded"
        # After start-up the control port is closed (the number may since have been reused
        # by another listener, e.g. gloo's); whatever answers there, the payload goes nowhere.
        try:
            with socket.create_connection(("127.0.0.1", seen_port[0]), timeout=1) as s:
                s.sendall(evil)
        except OSError:
            pass
        assert not marker.exists()
        out = pool.run("import torch.distributed as dist\ndist.get_rank()")
        assert out.values == [0, 1]
    finally:
        pool.stop()


def test_control_channel_listens_on_loopback_only():
    from ddp_magic.kernel.pool import Pool

    pool = Pool(1)
    addrs = []
    real_bind = socket.socket.bind

    def spy(self, addr):
        addrs.append(addr)
        return real_bind(self, addr)

    socket.socket.bind = spy
    try:
        pool.start()
    finally:
        socket.socket.bind = real_bind
        pool.stop()
    assert addrs and all(a[0] == "127.0.0.1" for a in addrs), addrs


def test_handshake_rejects_a_wrong_secret():
    from ddp_magic.wire import protocol as P

    a, b = socket.socketpair()
    errors = []

    def server():
        try:
            P.server_handshake(a, b"right" * 8)
        except P.AuthenticationError as e:
            errors.append(e)
            a.close()  # what the pool does with a peer that fails the challenge

    t = threading.Thread(target=server)
    t.start()
    with pytest.raises((P.AuthenticationError, ConnectionError)):
        P.client_handshake(b, b"wrong" * 8)
    t.join(2)
    assert errors
    b.close()


def test_secret_never_leaks(k4):
    k4.run("%%ddp\nimport os\nos.getpid()").ok()
    pids = k4.value("list(_)")
    secret = k4.value("get_ipython().magics_manager.registry['DDPMagics'].pool.secret.hex()")
    for pid in pids + worker_pids_of(k4.pid):
        for what in ("environ", "cmdline"):
            with open(f"/proc/{pid}/{what}", "rb") as f:
                assert secret.encode() not in f.read(), f"secret in /proc/{pid}/{what}"
    ex = k4.run("%ddp_env").ok()
    assert secret not in str(ex.displays)
    k4.run("env_json = %ddp_env --json").ok()
    assert secret not in k4.run("print(env_json)").ok().stdout


# 9 ---------------------------------------------------------------------------
def test_soak_500_cells_no_growth(k4):
    k4.run("%%ddp -n 4\nimport torch, torch.distributed as dist\n1", timeout=180).ok()
    body = "%%ddp\nx = torch.ones(8) * dist.get_rank()\ndist.all_reduce(x)\nif {fail}:\n    raise RuntimeError('planned failure')\nx.sum().item()"
    for i in range(30):
        k4.run(body.format(fail=i % 10 == 9))
    rss0, fds0 = _kernel_rss_fds(k4)
    t0 = time.monotonic()
    failed = 0
    for i in range(500):
        ex = k4.run(body.format(fail=i % 10 == 9), timeout=60)
        failed += ex.error is not None
    took = time.monotonic() - t0
    rss1, fds1 = _kernel_rss_fds(k4)
    kids = worker_pids_of(k4.pid)
    ranks = k4.value("get_ipython().magics_manager.registry['DDPMagics'].session.pool.pids")
    print(
        f"SOAK 500 cells (-n 4, {failed} failing) in {took:.1f}s: kernel RSS {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB, "
        f"fds {fds0} -> {fds1}, processes {len(kids)}"
    )
    assert failed == 50
    assert fds1 - fds0 <= 2
    assert rss1 - rss0 < 30 * 2**20
    # the template, the four ranks and at most four idle spare ranks (forked for the next pool): nothing left over
    assert set(ranks) <= set(kids) and len(kids) <= 1 + 4 + 4, (ranks, kids)


# ----------------------------------------------------------------------------- helpers
_fresh = {}


def _fresh_kernel() -> Kernel:
    if "k" not in _fresh:
        _fresh["k"] = Kernel()
        _fresh["k"].run("%load_ext ddp_magic").ok()
    return _fresh["k"]


@pytest.fixture(scope="module", autouse=True)
def _close_fresh():
    yield
    if "k" in _fresh:
        _fresh.pop("k").shutdown()


def _pids(k: Kernel) -> list:
    k.run("%%ddp\nimport os\nos.getpid()").ok()
    return k.value("list(_)")


def _kernel_rss_fds(k: Kernel):
    with open(f"/proc/{k.pid}/statm") as f:
        rss = int(f.read().split()[1]) * resource.getpagesize()
    return rss, len(os.listdir(f"/proc/{k.pid}/fd"))


def _evil_pickle(marker) -> bytes:
    import pickle
    import struct

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    body = pickle.dumps({"op": "hello", "rank": 0, "x": Evil()})
    return struct.pack("!Q", len(body)) + body
