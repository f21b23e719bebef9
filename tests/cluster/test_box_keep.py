"""A kept Slurm pool whose nodes are other hosts than its kernel's (the cluster in a box; docs/keep.md, "Across hosts").

The kernel runs on ``login``, its ranks on ``n1`` and ``n2``. The lease is held by n1's template and listens on TCP
there, TLS with a certificate of its own; n2's template and every rank reach it over the network, and on login the
process that holds the allocation follows it (procs/lease_watch.py): it holds the liveness lock and mirrors the
discovery file there. A kept background job through a SIGKILL of its kernel: the next kernel on login attaches over
the network, every tick shown (no gap), the result and a variable kept, a rank on n2 killed and forked again by n2's
template with the pool's TLS pinned to the new kernel, the all_reduce right; the intruder host cannot pass the lease
without the secret. Then, first round, ``--idle 5s`` and a SIGKILL: no rank, no job, and the next look says why;
second round, ``%ddp stop`` in the attached kernel: the allocation released with the lease, and said. Nothing left.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import box_fixtures
import cluster_box
import pytest

from kernel_helper import Kernel, alive
from keep_helper import TICKS, cell_texts, ticked, kept_record, sigkill_kept, ticks

box = box_fixtures.box  # the fixtures, by name in this module

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

START = ("%%ddp --slurm --nodes 2 --ntasks-per-node 2\nimport os, socket, time, torch, torch.distributed as dist\n"
         "kept = 100 + dist.get_rank()\n(socket.gethostname(), os.getpid())")
N, AT = 30, 15
POOL = "get_ipython().magics_manager.registry['DDPMagics'].session.pool"




def _squeue(b: cluster_box.Box, job: str) -> str:
    """The job's state as login's squeue says it ("" once it is gone)."""
    done = subprocess.run(b.enter("login") + ["squeue", "-h", "-j", job, "-o", "%T"], env=dict(os.environ, **b.env()),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 or "Invalid job id" in done.stderr, done.stderr
    return done.stdout.strip()


def _intruder_refused(b: cluster_box.Box, at: dict) -> None:
    """From the intruder host, the lease's port: a TLS handshake with no secret gets nothing and is dropped."""
    probe = ("import socket, ssl\nctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE\n"
             f"s = ctx.wrap_socket(socket.create_connection(({at['host']!r}, {at['port']}), timeout=10))\n"
             "s.recv(64)\ns.sendall(b'x' * 64)\ns.settimeout(10)\n"
             "try:\n    print('more', s.recv(64))\nexcept (OSError, ssl.SSLError) as e:\n    print('dropped', type(e).__name__)\n")
    out = b.run("intruder", [sys.executable, "-c", probe], timeout=60)
    assert "more b''" in out.stdout or "dropped" in out.stdout, (out.stdout, out.stderr)


def _attach_and_finish(k: Kernel, first: str, ranks: List[int], gate: str) -> None:
    ex = k.run("%ddp attach --out job", timeout=120).ok()
    assert "attached the kept pool" in ex.stdout and "4 ranks alive" in ex.stdout, (ex.stdout, ex.stderr)
    assert "is still running: its output follows" in ex.stdout, ex.stdout
    print("attach over the network, with a job running:", re.search(r"in [\d.]+ s", ex.stdout).group())  # type: ignore[union-attr]
    os.unlink(gate)
    assert k.value("job.wait(120)") is True
    result = k.run("job.result()", timeout=60).ok().result or ""
    assert all(f"('done', {100 + r})" in result for r in range(4)), result
    shown, second = ticks(first), ticks(cell_texts(k, ex))
    for r in range(4):
        assert set(shown.get(r, []) + second.get(r, [])) == set(range(N)), (r, shown.get(r), second.get(r))
    assert "[rank 3 n2] tick" in cell_texts(k, ex)


def _idle_ends(b: cluster_box.Box, k: Kernel, job: str, runtime: str, env: Dict[str, str]) -> None:
    """``--idle 5s`` and a SIGKILL: no rank, no job; a stop from login's terminal says why it had ended; nothing left."""
    assert "kept pool" in k.run("%ddp keep --idle 5s").ok().stdout
    live = k.value("[i.pid for i in " + POOL + ".ranks.values()]")
    pool_id = k.value(f"{POOL}.kept.id")
    sigkill_kept(k)
    t0 = time.monotonic()
    while (any(alive(p) for p in live) or _squeue(b, job)) and time.monotonic() - t0 < 30:
        time.sleep(0.2)
    assert not any(alive(p) for p in live) and not _squeue(b, job), (live, _squeue(b, job), kept_record(runtime))
    print(f"--idle 5s, then a SIGKILL: no rank and no job at {time.monotonic() - t0:.1f} s")
    said = subprocess.run(b.enter("login") + [sys.executable, "-m", "ddp_magic", "stop", pool_id],
                          env=box_fixtures.kernel_env(b, **env), capture_output=True, text=True, timeout=60).stdout
    assert f"the kept pool {pool_id} had ended already: no kernel attached and no job running for its lease's --idle" in said, said
    _nothing_left(runtime)


def _stopped(b: cluster_box.Box, k: Kernel, job: str, runtime: str) -> None:
    """``%ddp stop`` in the attached kernel: the lease ends, the allocation with it (said), nothing left."""
    live = k.value("[i.pid for i in " + POOL + ".ranks.values()]")
    said = k.run("%ddp stop", timeout=60).ok().stdout
    assert f"Slurm job {job} released with the lease: its nodes are free" in said, said
    t0 = time.monotonic()
    while _squeue(b, job) and time.monotonic() - t0 < 30:
        time.sleep(0.2)
    assert not any(alive(p) for p in live) and not _squeue(b, job), (live, _squeue(b, job))
    _nothing_left(runtime)


def _nothing_left(runtime: str) -> None:
    assert os.listdir(runtime) in ([], ["ddp-held"]), os.listdir(runtime)
    assert not os.listdir(os.path.join(runtime, "ddp-held")), "nothing of the lease left on n1"


def test_a_kept_pool_on_other_hosts_outlives_its_kernel(box: cluster_box.Box) -> None:
    runtime = tempfile.mkdtemp(prefix="k33b-", dir="/tmp")
    env = {"JUPYTER_RUNTIME_DIR": runtime, "JPY_SESSION_NAME": "box.ipynb"}
    try:
        for attempt in range(2):
            k = box_fixtures.login_kernel(box, **env)
            try:
                k.run(START, timeout=240).ok()
                values = k.value("[tuple(v) for v in _]")
                assert [v[0] for v in values] == ["n1", "n1", "n2", "n2"], values
                ranks, job = [v[1] for v in values], k.value(f"{POOL}.launcher.job_id()")
                gate = os.path.join(runtime, "gate")
                open(gate, "w").close()
                ex = k.run(TICKS.format(n=N, at=AT, gate=gate), timeout=120).ok()
                assert "kept pool" in ex.stdout, (ex.stdout, ex.stderr)
                ticked(k, ex, 4)
                record = kept_record(runtime)
                at = record["lease"]
                assert at.get("host") == box.host("n1").mgmt and at.get("fp") and record.get("holder") == "n1", record.get("lease")
                assert not [f for _, _, fs in os.walk(runtime) for f in fs if f.endswith(".sock")], "no lease socket on login"
                _intruder_refused(box, at)
                first = sigkill_kept(k, ex)
                assert all(alive(p) for p in ranks) and _squeue(box, job) == "RUNNING", "kept through a SIGKILL of its kernel"
                k = box_fixtures.login_kernel(box, **env)
                _attach_and_finish(k, first, ranks, gate)
                box_fixtures.kept_rank_recovers(k, ranks)
                if attempt == 0:
                    _idle_ends(box, k, job, runtime, env)
                else:
                    _stopped(box, k, job, runtime)
            finally:
                k.kc.stop_channels()
                k.km.shutdown_kernel(now=True)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)

