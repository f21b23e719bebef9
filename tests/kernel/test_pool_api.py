"""The plain-Python API the magics and the session sit on: Pool.run without a kernel, both start methods."""
from __future__ import annotations

import os
import threading

import pytest

from ddp_magic.errors import PlanError
from ddp_magic.kernel import CellOutcome, Listener, Pool, RankInfo
from ddp_magic.plan.spec import PoolSpec
from ddp_magic.states import FailureKind, RankState
from ddp_magic.wire.transfer import Unpicklable


class Recorder(Listener):
    def __init__(self):
        self.out, self.states, self.notices = [], [], []

    def on_output(self, rank, stream, text):
        self.out.append((rank, stream, text))

    def on_state(self, info):
        self.states.append((info.rank, info.state))

    def on_notice(self, text):
        self.notices.append(text)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_run_output_results_and_death(method):
    pool = Pool(2, start_method=method)
    rec = Recorder()
    try:
        src = "import os, sys, torch.distributed as dist\nprint('hi', dist.get_rank())\nprint('oops', file=sys.stderr)\ndist.get_rank() * 10"
        out = pool.run(src, listener=rec)
        assert out.ok and out.values == [0, 10]
        text = {(r, s): "".join(t for rr, ss, t in rec.out if (rr, ss) == (r, s)) for r in (0, 1) for s in ("stdout", "stderr")}
        assert text[(1, "stdout")] == "hi 1\n" and text[(0, "stderr")] == "oops\n"
        assert (0, RankState.RUNNING) in rec.states and (1, RankState.DONE) in rec.states
        # each rank leads a session of its own, as under torchrun (the scheduler shares
        # the cores per session), and none is in the caller's
        out = pool.run("(os.getsid(0) == os.getpid(), os.getsid(0))", listener=rec)
        assert [own for own, _ in out.values] == [True, True] and os.getsid(0) not in [sid for _, sid in out.values]
        out = pool.run("import os\nif dist.get_rank() == 1:\n    os._exit(4)\n1", listener=rec)
        assert [f.headline() for f in out.failures][0].endswith("exited with code 4")
        assert not out.state_lost and pool.broken is None  # rank 0 keeps its state; rank 1 alone starts again
        out = pool.run("import torch.distributed as dist\ndist.get_rank()", listener=rec)
        assert out.values == [0, 1]
        assert any("started it again" in n for n in rec.notices)
    finally:
        pool.stop()


def test_live_env_and_ask():
    pool = Pool(2)
    try:
        pool.start()
        env = pool.live_env()
        assert sorted(env) == [0, 1]
        assert env[1]["env"]["RANK"] == "1" and env[0]["process_group"]["initialised"] is True
        assert all("SECRET" not in k for k in env[0]["env"])
    finally:
        pool.stop()


def test_a_failing_listener_does_not_break_the_cell():
    class Broken(Listener):
        def on_output(self, rank, stream, text):
            raise RuntimeError("view bug")

    pool = Pool(2)
    try:
        out = pool.run("print('x')\n7", listener=Broken())
        assert out.ok and out.values == [7, 7]
        assert any("view bug" in n for n in out.notes)
        assert pool.run("8").values == [8, 8]
    finally:
        pool.stop()


def _voluntary_switches(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def test_a_quiet_cell_s_done_names_the_last_markers_and_output_still_comes_first():
    """A stream nothing was written to needs no new marker (its DONE names the last one, read already: one read per
    rank, not three); a write below Python (a raw fd write, a child process) still gets one, and comes before the DONE."""
    pool = Pool(2)
    rec = Recorder()
    try:
        for _ in range(2):
            pool.run("print('marked')")
            marked = pool.hub.done[0]["sync"]["stdout"]
            out = pool.run("1")
            assert out.ok and [pool.hub.done[r]["sync"]["stdout"] for r in (0, 1)] == [marked, marked]  # no new stdout marker
            rec.out.clear()
            out = pool.run("import os, subprocess\nos.write(1, b'raw\\n')\nsubprocess.run(['echo', 'child'])\n3", listener=rec)
            assert out.ok and out.values == [3, 3] and pool.hub.done[1]["sync"]["stdout"] > marked
            text = {r: "".join(t for rr, ss, t in rec.out if rr == r and ss == "stdout") for r in (0, 1)}
            assert text == {0: "raw\nchild\n", 1: "raw\nchild\n"}  # all read before the cell ended
    finally:
        pool.stop()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts wake-ups in Linux /proc")
def test_a_quiet_cell_does_not_wake_the_caller_often(tmp_path):
    """While the ranks compute without a word, the poll loop sleeps until an event or the next
    deadline. It used to poll every 50 ms: ~60 wake-ups in a 3 s cell, on the cores the ranks train on."""
    pool = Pool(2)
    try:
        pool.run("1")
        tid = threading.get_native_id()
        before = _voluntary_switches(tid)
        out = pool.run("import time\ntime.sleep(3)\n2")
        woke = _voluntary_switches(tid) - before
        assert out.ok and out.values == [2, 2]
        assert woke <= 25, f"the caller woke {woke} times during a quiet 3 s cell"
        slept = tmp_path / "slept"
        out = pool.run(f"import pathlib, time\ntime.sleep(30)\npathlib.Path({str(slept)!r}).touch()", timeout=1.0)
        assert [f.kind for f in out.failures][:1] == [FailureKind.TIMEOUT]
        assert not slept.exists(), "a deadline still ends the sleep on time: the loop woke for it, not once the ranks were done"
    finally:
        pool.stop()


def test_a_pool_is_made_from_a_spec_or_from_options():
    assert Pool(2, backend="gloo", grace=2.0).spec == PoolSpec(nproc=2, backend="gloo", grace=2.0)
    with pytest.raises(PlanError, match="unknown pool option"):
        Pool(2, colour="red")
    with pytest.raises(TypeError):
        Pool(PoolSpec(nproc=2), backend="gloo")
    pool = Pool(PoolSpec(nproc=4, nnodes=2))
    assert pool.nproc == 4 and pool.plan.nproc == 2 and pool.plan.nnodes == 2 and not pool.started


BOOM = """
import os
def _explode(pid):
    import os
    if os.getpid() != pid:
        raise RuntimeError("loads only on the rank")
    return pid
class Boom:
    def __reduce__(self):
        return (_explode, (os.getpid(),))
Boom() if dist.get_rank() == 1 else 5
"""


def test_an_unloadable_result_and_a_restart_with_a_new_spec():
    pool = Pool(PoolSpec(nproc=2))
    try:
        out = pool.run("import torch.distributed as dist\n" + BOOM)
        assert isinstance(out, CellOutcome) and out.ok and out.values[0] == 5
        assert isinstance(out.values[1], Unpicklable) and "loads only on the rank" in out.values[1].reason
        assert any("rank 1 could not be unpickled" in n for n in out.notes)
        generation = pool.generation
        pool.restart(spec=pool.spec.with_options(nproc=3))
        assert pool.spec.nproc == 3 and pool.generation == generation + 1
        assert all(isinstance(i, RankInfo) and i.state == RankState.READY for i in pool.ranks.values())
        assert pool.run("import torch.distributed as dist\ndist.get_world_size()").values == [3, 3, 3]
    finally:
        pool.stop()
    assert all(i.state == RankState.STOPPED for i in pool.ranks.values()) and not pool.started
