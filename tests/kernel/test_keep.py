"""Kept pools (docs/keep.md): a pool and its running job outlive their kernel, and the next kernel attaches them.

Real kernels (jupyter_client), real ranks, real lease files in a runtime directory of the test's own.
Nothing races the clock: a job that must still run while a kernel dies waits at a gate, a file the
test removes once the next kernel has attached. Each scenario runs twice, as a notebook user re-runs cells.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from typing import Dict, Iterator, List, Optional

import pytest

from conftest import pid_alive, wait_until
from ddp_magic.kernel.jobs.turns import clock_text
from ddp_magic.words import fmt_seconds
from kernel_helper import ANSI, Execution, Kernel, drop_runtime_dir, own_runtime_dir
from keep_helper import TICK, TICKS, ticks

pytestmark = pytest.mark.kernel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START = "%%ddp -n 2\nimport os, time, torch, torch.distributed as dist\nkept = dist.get_rank() + 100\nos.getpid()"
NEXT = "%%ddp\nt = torch.ones(1)\ndist.all_reduce(t)\n(kept, t.item())"
N, AT = 60, 30


@pytest.fixture
def runtime() -> Iterator[str]:
    """A runtime directory of this test's own (short: the lease socket's path must fit AF_UNIX); every pool left is stopped."""
    path = own_runtime_dir()
    yield path
    drop_runtime_dir(path)


def kernel(runtime: str, notebook: str = "keep.ipynb", **env: str) -> Kernel:
    k = Kernel(extra_env={"JUPYTER_RUNTIME_DIR": runtime, "JPY_SESSION_NAME": notebook, **env})
    k.run("%load_ext ddp_magic").ok()
    return k


def kill(k: Kernel) -> None:
    """SIGKILL the kernel, as the OOM killer would; what it sent before is read (a notebook showed it)."""
    os.kill(k.pid, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(k.pid), 10)
    k.collect(1.0)


def texts(k: Kernel, parent: str, ex: Execution) -> str:
    """Every stream text of one cell, its later (background) messages included, colour codes stripped."""
    msgs = ex.messages + [m for m in k.collect(0.3) if m["parent_header"].get("msg_id") == parent]
    return ANSI.sub("", "".join(m["content"].get("text", "") for m in msgs if m["msg_type"] == "stream"))



def pool_facts(k: Kernel) -> dict:
    """The kernel's pool as the test needs it: rank pids, its /dev/shm prefix, its kept id."""
    return k.value("(lambda p: {'pids': [i.pid for _, i in sorted(p.ranks.items())], 'shm': p.shm_prefix, "
                   "'id': p.kept.id if p.kept else None})(get_ipython().magics_manager.registry['DDPMagics'].session.pool)")


def discovery(runtime: str, pool_id: str) -> dict:
    with open(os.path.join(runtime, f"ddp-kept-{pool_id}.json")) as f:
        return json.load(f)


def nothing_left(runtime: str, facts: dict, template: int) -> bool:
    shm = [n for n in os.listdir("/dev/shm") if n.startswith(facts["shm"])]
    return not any(pid_alive(p) for p in facts["pids"] + [template]) and not shm and not os.path.exists(os.path.join(runtime, f"ddp-kept-{facts['id']}"))


def start_ticking(k: Kernel, gate: str) -> tuple:
    """A kept background job that prints ticks and waits at the gate at tick AT; returns once the kernel showed tick 10 of both ranks."""
    k.run(START, timeout=180).ok()
    ex = k.run(TICKS.format(n=N, at=AT, gate=gate), timeout=120).ok()
    # the cell's notice says kept once and stays short (an output area wraps anywhere: a long line split its time)
    assert re.search(r"^ddp_magic: kept pool [0-9a-f]+: ends 30 min after its kernel leaves, at most at (\w{3} )?\d\d:\d\d$", ex.stdout, re.M), ex.stdout
    seen = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen = texts(k, ex.msg_id, ex)
        if all(10 in ticks(seen).get(r, []) for r in (0, 1)):
            break
    return ex, seen


def attach_and_finish(k2: Kernel, gate: str, told: bool = False) -> str:
    """Attach, let the job go on past its gate, and check its result, a kept variable and the next cell's all_reduce.
    ``told``: the front end said what it holds, and the attach says it replays from there."""
    ex = k2.run("%ddp attach --out job", timeout=120).ok()
    assert "attached the kept pool" in ex.stdout and "2 ranks alive" in ex.stdout, ex.stdout
    assert "is still running: its output follows" + (" after the last line this page received" if told else ".") in ex.stdout, ex.stdout
    os.unlink(gate)
    assert k2.value("job.wait(120)") is True
    result = k2.run("job.result()", timeout=60).ok().result
    assert result is not None and "('done', 100)" in result and "('done', 101)" in result, result
    shown = texts(k2, ex.msg_id, ex)
    assert k2.run(NEXT, timeout=120).ok().result.splitlines()[1:] == ["  [0] (100, 2.0)", "  [1] (101, 2.0)"]
    return shown


def last_sent(k: Kernel, parent: str) -> Dict[int, List[int]]:
    """Per rank, the ticks of the last stream message the (SIGKILLed) kernel sent for it: the one ZeroMQ may have
    delivered after the kernel's last count (docs/keep.md, "Shown exactly once: the window a SIGKILL leaves")."""
    out: Dict[int, List[int]] = {}
    for m in k.elsewhere:
        if m["parent_header"].get("msg_id") == parent and m["msg_type"] == "stream":
            for rank, found in ticks(ANSI.sub("", m["content"]["text"])).items():
                out[rank] = found
    return out


def union_is_whole(first: str, second: str, window: Optional[Dict[int, List[int]]] = None, spools: Optional[Dict[int, str]] = None) -> None:
    """Every tick of every rank shown, by one kernel or the other, exactly once. After a SIGKILL (``window``: the ticks
    of the message the kernel was sending as it died), the one hand-over to ZeroMQ may go either way, and nothing else
    (docs/keep.md, "Shown exactly once: the window a SIGKILL leaves"): those ticks may show twice, or the ticks between
    the first kernel's last and the second's first may be missing from the notebook, and then they are in the spool."""
    a, b = ticks(first), ticks(second)
    for rank in (0, 1):
        mine, theirs = a.get(rank, []), b.get(rank, [])
        assert mine and theirs, f"rank {rank}: each kernel showed some ticks: first {mine}, second {theirs}"
        assert mine == sorted(set(mine)) and theirs == sorted(set(theirs)), f"rank {rank}: in order, once each: first {mine}, second {theirs}"
        twice = sorted(set(mine) & set(theirs))
        missing = sorted(set(range(N)) - set(mine) - set(theirs))
        if window is None:
            assert not twice and not missing, f"rank {rank}: first kernel {mine}, second {theirs}"
        assert not twice or set(twice) <= set((window or {}).get(rank, [])), f"rank {rank}: {twice} shown twice, not only the last message's"
        assert not missing or missing == list(range(mine[-1] + 1, theirs[0])), f"rank {rank}: {missing} missing, not only at the hand-over"
        for i in missing:
            assert f"tick {i}\n" in (spools or {}).get(rank, ""), f"rank {rank}: tick {i} is not even in the spool"
        if twice or missing:
            print(f"rank {rank}: at the SIGKILL, ticks {twice} shown by both kernels, {missing} only in the spool")
        assert sorted(set(mine) | set(theirs)) == sorted(set(range(N)) - set(missing)) and mine[0] == 0 and theirs[-1] == N - 1


def spool_texts(k: Kernel, runtime: str) -> Dict[int, str]:
    """Each rank's stdout spool of the kept pool ``k`` has (on disk, every byte the rank printed)."""
    pool_dir = os.path.join(runtime, f"ddp-kept-{pool_facts(k)['id']}")
    out = {}
    for rank in (0, 1):
        with open(os.path.join(pool_dir, f"r{rank}.out"), errors="replace") as f:
            out[rank] = f.read()
    return out


def stop_and_check(k: Kernel, runtime: str) -> None:
    facts = pool_facts(k)
    template = discovery(runtime, facts["id"])["template_pid"]
    assert "stopped the pool" in k.run("%ddp stop").ok().stdout
    assert wait_until(lambda: nothing_left(runtime, facts, template), 15)
    assert not [n for n in os.listdir(runtime) if n.startswith("ddp-kept-")]


def held_by(msgs: List[dict]) -> Dict[str, Dict[str, List[int]]]:
    """What a front end holds of each kept pool, as the JupyterLab extension keeps it (labextension/src/held.ts): per
    rank, the highest [stdout, stderr] spool offsets the metadata of the stream messages it received carry."""
    held: Dict[str, Dict[str, List[int]]] = {}
    for m in msgs:
        meta = (m.get("metadata") or {}).get("ddp_magic") or {}
        if m["msg_type"] == "stream" and meta.get("upto"):
            pool = held.setdefault(meta["pool"], {})
            for rank, (out, err) in meta["upto"].items():
                had = pool.get(rank, [0, 0])
                pool[rank] = [max(out, had[0]), max(err, had[1])]
    return held


def tell(k: Kernel, held: Dict[str, Dict[str, List[int]]], in_hello: bool) -> None:
    """Play the extension towards a new kernel: open the ddp_magic comm and say what the page holds, in the comm's
    hello or in a message after it (ui/labcomm.py). The shell handles them before the next cell."""
    said = [{"type": "shown", "pool": pool, "upto": upto} for pool, upto in held.items()]
    comm_id = uuid.uuid4().hex
    hello = {"type": "hello", "protocol": 1, "version": "test", **({"shown": said} if in_hello else {})}
    k.kc.shell_channel.send(k.kc.session.msg("comm_open", {"comm_id": comm_id, "target_name": "ddp_magic", "data": hello}))
    for data in [] if in_hello else said:
        k.kc.shell_channel.send(k.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": data}))


@pytest.mark.parametrize("end", ["sigkill-front", "sigkill", "restart", "shutdown"])
def test_a_kept_job_outlives_its_kernel(runtime: str, tmp_path, end: str) -> None:
    """The job goes on through the kernel's end; the next kernel shows every tick the first did not, once. After a
    SIGKILL, exactly once when the front end says what it received (``sigkill-front``: the extension's part, with the
    kernel's own count made wrong both ways: the front end's word wins); without it, the one message ipykernel was
    sending may go either way (``sigkill``: docs/keep.md)."""
    for round_ in range(2):
        gate = str(tmp_path / f"gate{round_}")
        open(gate, "w").close()
        k1 = kernel(runtime)
        k2 = None
        try:
            ex1, _ = start_ticking(k1, gate)
            if end.startswith("sigkill"):
                kill(k1)
                first = texts(k1, ex1.msg_id, ex1)
                k2 = kernel(runtime)
            elif end == "restart":
                k1.km.restart_kernel(now=False)
                k1.collect(1.0)
                first = texts(k1, ex1.msg_id, ex1)
                k1.run("%load_ext ddp_magic").ok()
                k2, k1 = k1, None
            else:
                k1.km.shutdown_kernel(now=False)
                k1.collect(1.0)
                first = texts(k1, ex1.msg_id, ex1)
                k1.kc.stop_channels()
                k1 = None
                k2 = kernel(runtime)
            window = last_sent(k1, ex1.msg_id) if end == "sigkill" else None
            if end == "sigkill-front":
                assert k1 is not None
                held = held_by(ex1.messages + k1.elsewhere)
                pool = discovery_id(runtime)
                assert list(held) == [pool], held
                ticked = [m for m in ex1.messages + k1.elsewhere if m["msg_type"] == "stream" and TICK.search(ANSI.sub("", m["content"]["text"]))]
                assert ticked and all(m["metadata"]["ddp_magic"]["pool"] == pool for m in ticked), "every message of kept lines says its pool"
                miscount(runtime, pool, -1 if round_ == 0 else +1)
                tell(k2, held, in_hello=round_ == 0)
            second = attach_and_finish(k2, gate, told=end == "sigkill-front")
            union_is_whole(first, second, window, spool_texts(k2, runtime))
            stop_and_check(k2, runtime)
        finally:
            for k in (k1, k2):
                if k is not None:
                    k.shutdown()


def miscount(runtime: str, pool: str, way: int) -> None:
    """The kernel's own count, off as the SIGKILL window leaves it, and more: behind (the replay would show ticks twice)
    or ahead (it would skip some). The front end's word is what the attach must take."""
    from ddp_magic.wire.kept import ShownOffsets

    shown = ShownOffsets(os.path.join(runtime, f"ddp-kept-{pool}", "shown"), 2)
    for rank in (0, 1):
        shown.set(rank, {"stdout": 0 if way < 0 else shown.get(rank, "stdout") + 100})
    shown.close()


def discovery_id(runtime: str) -> str:
    """The one kept pool's id, from its discovery file's name."""
    (name,) = [n for n in os.listdir(runtime) if n.startswith("ddp-kept-") and n.endswith(".json")]
    return name[len("ddp-kept-"):-len(".json")]


def test_idle_lease_ends_the_pool(runtime: str) -> None:
    """%ddp keep --idle 5s, then SIGKILL: within 15 s no rank, no template, no /dev/shm file; attach says why."""
    for _ in range(2):
        k = kernel(runtime)
        k.run(START, timeout=180).ok()
        out = k.run("%ddp keep --idle 5s").ok().stdout
        assert "kept pool " in out and ": ends 5 s after its kernel leaves, at most at " in out and "kept:" not in out, out
        facts = pool_facts(k)
        template = discovery(runtime, facts["id"])["template_pid"]
        kill(k)
        assert pid_alive(template) and all(pid_alive(p) for p in facts["pids"])
        assert wait_until(lambda f=facts, t=template: nothing_left(runtime, f, t), 15)
        assert discovery(runtime, facts["id"])["state"] == "ended"
        k2 = kernel(runtime)
        try:
            out = k2.run("%ddp attach").ok().stdout
            assert f"the kept pool {facts['id']} ended at" in out and "--idle" in out, out
            assert not os.path.exists(os.path.join(runtime, f"ddp-kept-{facts['id']}.json"))
        finally:
            k2.shutdown()


def test_max_ends_a_running_job_and_attach_says_so(runtime: str) -> None:
    for _ in range(2):
        k = kernel(runtime)
        k.run(START, timeout=180).ok()
        k.run("%ddp keep --max 8s").ok()
        k.run("%%ddp --bg --out job --keep\nwhile True:\n    time.sleep(0.05)").ok()
        facts = pool_facts(k)
        template = discovery(runtime, facts["id"])["template_pid"]
        kill(k)
        assert wait_until(lambda f=facts, t=template: nothing_left(runtime, f, t), 30)
        k2 = kernel(runtime)
        try:
            out = k2.run("%ddp attach").ok().stdout
            assert f"the kept pool {facts['id']} ended at" in out and "--max" in out and "ran out" in out, out
            assert "ended with it" in out, out  # the job it was running
        finally:
            k2.shutdown()


def test_one_kernel_at_a_time_and_force_fences(runtime: str) -> None:
    k1 = kernel(runtime)
    try:
        k1.run(START, timeout=180).ok()
        k1.run("%ddp keep").ok()
        for _ in range(2):
            k2 = kernel(runtime)
            try:
                ex = k2.run("%ddp attach")
                assert ex.error is not None and "is attached to" in ex.error[1] and "--force takes it over" in ex.error[1], ex.error
                out = k2.run("%ddp attach --force", timeout=120).ok().stdout
                assert "attached the kept pool" in out
                assert k2.run(NEXT, timeout=120).ok().result.splitlines()[1:] == ["  [0] (100, 2.0)", "  [1] (101, 2.0)"]
                ex = k1.run(NEXT, timeout=60)
                assert ex.error is not None and "this kernel lost its kept pool" in ex.error[1], ex.error
                ex = k1.run("%ddp attach --force", timeout=120).ok()  # and back
                assert "attached the kept pool" in ex.stdout
                assert k1.run(NEXT, timeout=120).ok().result.splitlines()[1:] == ["  [0] (100, 2.0)", "  [1] (101, 2.0)"]
                ex = k2.run(NEXT, timeout=60)
                assert ex.error is not None and "this kernel lost its kept pool" in ex.error[1], ex.error
            finally:
                k2.shutdown()
        stop_and_check(k1, runtime)
    finally:
        k1.shutdown()


LINES = """%%ddp --bg --out job --keep
while os.path.exists({gate!r}):
    time.sleep(0.02)
for i in range(2000):
    print(f'line {{i:04d}}', flush=True)
'done'
"""
LINE = re.compile(r"\[rank (\d+)\] line (\d{4})\n")


def test_a_capped_spool_says_what_it_dropped(runtime: str, tmp_path) -> None:
    """DDP_MAGIC_SPOOL_MIB: a spool past its cap drops its oldest half; the attach says how much no kernel showed and
    replays the rest, from a line's start to the last line, once."""
    for round_ in range(2):
        gate = str(tmp_path / f"gate{round_}")
        open(gate, "w").close()
        k1 = kernel(runtime, DDP_MAGIC_SPOOL_MIB="0.01")  # 10 KiB a stream; the job prints 20 KiB a rank while detached
        k2 = None
        try:
            k1.run(START, timeout=180).ok()
            facts = pool_facts(k1)
            k1.run(LINES.format(gate=gate), timeout=120).ok()
            kill(k1)
            os.unlink(gate)
            spools = [os.path.join(runtime, f"ddp-kept-{discovery_id(runtime)}", f"r{r}.out") for r in (0, 1)]
            assert wait_until(lambda spools=spools: all(os.path.exists(p) and "line 1999" in open(p).read() for p in spools), 60)
            assert all(os.path.getsize(p) <= 10485 for p in spools)  # 0.01 MiB
            k2 = kernel(runtime, DDP_MAGIC_SPOOL_MIB="0.01")
            ex = k2.run("%ddp attach --out job", timeout=120).ok()
            assert "ended while no kernel was attached: its output and result follow." in ex.stdout, ex.stdout
            dropped = re.findall(r"rank (\d): ([\d.]+) KiB of its stdout that no kernel showed were dropped from its output log "
                                 r"\(it keeps at most its newest 10.2 KiB a stream; DDP_MAGIC_SPOOL_MIB sets it\)", ex.stdout)
            assert sorted(r for r, _ in dropped) == ["0", "1"], ex.stdout
            assert k2.value("job.wait(60)") is True
            shown = texts(k2, ex.msg_id, ex)
            for rank in (0, 1):
                mine = [int(i) for r, i in LINE.findall(shown) if int(r) == rank]
                assert mine and mine == list(range(mine[0], 2000)) and mine[0] > 0, f"rank {rank}: {mine[:3]}…{mine[-3:]}"
            assert pool_facts(k2)["pids"] == facts["pids"]
            stop_and_check(k2, runtime)
        finally:
            for k in (k1, k2):
                if k is not None:
                    k.shutdown()


SENT = """%%ddp --bg --out job --keep
open({mark!r} + str(dist.get_rank()), 'w').write(str(len(blob)))
'done'"""


def test_a_kernel_killed_as_its_kept_cell_returns_loses_nothing(runtime: str, tmp_path) -> None:
    """``%%ddp --bg --keep`` returns once the ranks hold the job: a kernel SIGKILLed the moment the cell returned (its
    64 MiB notebook name makes the send take a while) leaves the job to run, and the next kernel gets its end."""
    for round_ in range(2):
        mark = str(tmp_path / f"ran{round_}-")
        k1, k2 = kernel(runtime), None
        try:
            k1.run(START, timeout=180).ok()
            k1.run("blob = bytes(64 << 20)").ok()
            k1.run(SENT.format(mark=mark), timeout=120).ok()
            kill(k1)
            assert wait_until(lambda mark=mark: all(os.path.exists(f"{mark}{r}") for r in (0, 1)), 60), "the job ran on both ranks"
            assert [open(f"{mark}{r}").read() for r in (0, 1)] == [str(64 << 20)] * 2
            k2 = kernel(runtime)
            ex = k2.run("%ddp attach --out job", timeout=120).ok()
            assert "ended while no kernel was attached: its output and result follow." in ex.stdout, ex.stdout
            assert k2.value("job.wait(60)") is True
            assert k2.value("str(job.result())").splitlines()[1:] == ["  [0] 'done'", "  [1] 'done'"], "each rank's result, none lost with k1"
            stop_and_check(k2, runtime)
        finally:
            for k in (k1, k2):
                if k is not None:
                    k.shutdown()


PREEMPT_SETUP = "%%ddp -n 2\nimport os, time, torch, torch.distributed as dist, ddp_magic\nstep = 0"
PREEMPT_JOB = """%%ddp --bg --out job --keep --save-on-preempt {folder} --save-every 1s {every}
while not os.path.exists({stop!r}):
    step += 1
    dist.all_reduce(torch.ones(1))
    ddp_magic.log(step=step, loss=1.0 / step)
    time.sleep(0.02)
step"""


def test_a_kept_pool_preempted_while_attached_saves_and_a_new_pool_goes_on(runtime: str, tmp_path) -> None:
    """--save-on-preempt and --save-every on a kept job survive its kernel: the kernel that attaches arms the pool again
    and takes the job's saves on, so a SIGTERM to the template while it is attached saves at a safe point, the attach
    cell says the step, nothing of the pool is left, and ``%ddp load`` goes on from that step in a new pool."""
    for round_ in range(2):
        folder, stop, every = str(tmp_path / f"ckpt{round_}"), str(tmp_path / f"never{round_}"), str(tmp_path / f"every{round_}")
        k1, k2 = kernel(runtime), None
        try:
            k1.run(PREEMPT_SETUP, timeout=180).ok()
            k1.run(PREEMPT_JOB.format(folder=folder, stop=stop, every=every), timeout=120).ok()
            assert wait_until(lambda k=k1: len(k.value("job.metrics['step']")) > 10, 60)
            facts = pool_facts(k1)
            template = discovery(runtime, facts["id"])["template_pid"]
            kill(k1)
            k2 = kernel(runtime)
            ex = k2.run("%ddp attach --out job", timeout=120).ok()
            assert "is still running" in ex.stdout and f"armed: a preemption saves to {folder}" in texts(k2, ex.msg_id, ex), texts(k2, ex.msg_id, ex)
            saving = rf"saving step \d+ to {re.escape(every)}/step-\S+ at a safe point \(--save-every 1s\)"  # this kernel's, in the attach cell
            assert wait_until(lambda k=k2, e=ex, pat=saving: re.search(pat, texts(k, e.msg_id, e)) is not None, 60), texts(k2, ex.msg_id, ex)[-2000:]
            os.kill(template, signal.SIGTERM)
            said = re.escape(folder)
            line = rf"preempted: saved step (\d+) to {said}/step-\S+ \([\d.]+ s\); %ddp load {said} on the next allocation"
            assert wait_until(lambda k=k2, e=ex, pat=line: re.search(pat, texts(k, e.msg_id, e)) is not None, 120), texts(k2, ex.msg_id, ex)[-2000:]
            step = int(re.search(line, texts(k2, ex.msg_id, ex)).group(1))  # type: ignore[union-attr]
            assert wait_until(lambda f=facts, t=template: nothing_left(runtime, f, t), 30), "the preempted pool ended, lease and all"
            loaded = k2.run(f"%ddp load {folder}", timeout=180).ok()
            assert f"(step {step}, saved by 2 ranks) into 2 ranks" in loaded.stdout, loaded.stdout
            assert k2.run("%%ddp\nstep", timeout=120).ok().result == f"RankResults(2 ranks):\n  [0] {step}\n  [1] {step}"
            k2.run("%ddp stop").ok()
        finally:
            for k in (k1, k2):
                if k is not None:
                    k.shutdown()


def test_a_rank_that_died_meanwhile_is_reported_and_replaced(runtime: str) -> None:
    for _ in range(2):
        k = kernel(runtime)
        k.run(START, timeout=180).ok()
        k.run("%ddp keep").ok()
        facts = pool_facts(k)
        kill(k)
        os.kill(facts["pids"][1], signal.SIGKILL)
        assert wait_until(lambda p=facts["pids"][1]: not pid_alive(p), 10)
        k2 = kernel(runtime)
        try:
            out = k2.run("%ddp attach", timeout=120).ok().stdout
            assert f"rank 1 (pid {facts['pids'][1]}) died (signal SIGKILL)" in out and "1 rank alive" in out, out
            ex = k2.run("%%ddp\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()", timeout=180).ok()
            assert "started it again" in ex.stdout, ex.stdout
            assert ex.result.splitlines()[1:] == ["  [0] 2.0", "  [1] 2.0"]
            stop_and_check(k2, runtime)
        finally:
            k2.shutdown()


def test_terminal_lists_and_stops(runtime: str) -> None:
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=runtime, PYTHONPATH=ROOT)
    k = kernel(runtime)
    try:
        k.run(START, timeout=180).ok()
        for _ in range(2):
            pool_id = k.run("%ddp keep").ok().stdout.split("kept pool ")[1].split(":")[0]
            out = subprocess.run([sys.executable, "-m", "ddp_magic", "kept"], env=env, capture_output=True, text=True, timeout=60)
            assert pool_id in out.stdout and "keep.ipynb" in out.stdout and "2 ranks" in out.stdout, out
            k.run("%ddp keep --off").ok()
            out = subprocess.run([sys.executable, "-m", "ddp_magic", "kept"], env=env, capture_output=True, text=True, timeout=60)
            assert "no kept pool" in out.stdout, out.stdout
        pool_id = k.run("%ddp keep").ok().stdout.split("kept pool ")[1].split(":")[0]
        facts = pool_facts(k)
        kill(k)
        out = subprocess.run([sys.executable, "-m", "ddp_magic", "stop", pool_id], env=env, capture_output=True, text=True, timeout=60)
        assert f"stopped the kept pool {pool_id}" in out.stdout, out
        assert wait_until(lambda: not any(pid_alive(p) for p in facts["pids"]), 15)
    finally:
        k.shutdown()


def _other_user() -> str:
    name = f"k33u{os.getpid() % 10000}"
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip("creating another Unix user needs root and useradd/runuser")
    proc = subprocess.run(["useradd", "--no-create-home", name], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"useradd failed: {proc.stderr.strip()}")
    return name


def test_another_user_cannot_list_or_attach(runtime: str) -> None:
    user = _other_user()
    k = kernel(runtime)
    try:
        k.run(START, timeout=180).ok()
        pool_id = k.run("%ddp keep").ok().stdout.split("kept pool ")[1].split(":")[0]
        os.chmod(runtime, 0o755)  # even with the directory open to all, the files are not theirs
        python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
        if python is None:
            pytest.skip("no Python another user may run (this one lives in root's home)")
        env = {"PATH": os.environ["PATH"], "JUPYTER_RUNTIME_DIR": runtime, "PYTHONPATH": ROOT, "HOME": "/tmp"}
        sock = f"{runtime}/ddp-kept-{pool_id}/lease.sock"
        probe = ("import socket\nfrom ddp_magic.wire import kept\n"  # what `python -m ddp_magic kept` and attach read
                 "print('listed:', [d['id'] for _, d, _ in kept.listing()])\n"
                 f"try:\n    open({runtime!r} + '/ddp-kept-{pool_id}.json').read()\nexcept PermissionError:\n    print('secret: unreadable')\n"
                 f"try:\n    socket.socket(socket.AF_UNIX).connect({sock!r})\nexcept PermissionError:\n    print('lease socket: refused')\n")
        for _ in range(2):
            out = subprocess.run(["runuser", "-u", user, "--", python, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
            assert out.stdout.splitlines() == ["listed: []", "secret: unreadable", "lease socket: refused"], (out.stdout, out.stderr)
    finally:
        os.chmod(runtime, 0o700)
        k.shutdown()
        subprocess.run(["userdel", user], capture_output=True)


def test_keep_off_is_the_default_again(runtime: str) -> None:
    """keep, then --off: output goes straight to the kernel again, and the kernel's death ends every rank (no orphans)."""
    k = kernel(runtime)
    k.run(START, timeout=180).ok()
    facts = pool_facts(k)
    for _ in range(2):
        assert "kept pool" in k.run("%ddp keep").ok().stdout
        assert "no longer kept" in k.run("%ddp keep --off").ok().stdout
        out = k.run("%%ddp\nprint('after off', dist.get_rank())\nkept", timeout=120).ok()
        assert "[rank 0] after off 0" in out.stdout and "[rank 1] after off 1" in out.stdout, out.stdout
        assert not [n for n in os.listdir(runtime) if n.startswith("ddp-kept-")]
    kill(k)
    k.shutdown()
    assert wait_until(lambda: not any(pid_alive(p) for p in facts["pids"]), 15)


def test_other_options_end_the_lease(runtime: str) -> None:
    """%%ddp -n 3 on a kept pool of 2: the new pool is not kept, no lease file stays, and it dies with its kernel."""
    k = kernel(runtime)
    k.run(START, timeout=180).ok()
    for n in (3, 2):
        k.run("%ddp keep").ok()
        out = k.run(f"%%ddp -n {n}\nimport torch.distributed as dist\ndist.get_world_size()", timeout=180).ok()
        assert out.result is not None and f"[0] {n}" in out.result, out.result
        assert not [name for name in os.listdir(runtime) if name.startswith("ddp-kept-")]
        assert "kept:" not in k.run("%ddp status").ok().stdout
    facts = pool_facts(k)
    kill(k)
    k.shutdown()
    assert wait_until(lambda: not any(pid_alive(p) for p in facts["pids"]), 15)


def test_keep_off_after_attach(runtime: str) -> None:
    """Attached, then --off: the same ranks with their variables, and the pool ends with this kernel again."""
    for _ in range(2):
        k = kernel(runtime)
        k.run(START, timeout=180).ok()
        k.run("%ddp keep").ok()
        kill(k)
        k.shutdown()
        k2 = kernel(runtime)
        k2.run("%ddp attach", timeout=120).ok()
        assert "no longer kept" in k2.run("%ddp keep --off", timeout=60).ok().stdout
        assert k2.run(NEXT, timeout=120).ok().result.splitlines()[1:] == ["  [0] (100, 2.0)", "  [1] (101, 2.0)"]
        facts = pool_facts(k2)
        kill(k2)
        k2.shutdown()
        assert wait_until(lambda f=facts: not any(pid_alive(p) for p in f["pids"]), 15)
        assert not [n for n in os.listdir(runtime) if n.startswith("ddp-kept-")]


SESSION = "get_ipython().magics_manager.registry['DDPMagics'].session"
CLOCKS = (f"(lambda s: {{'rows': [(str(r.state), r.elapsed) for r in s.status().ranks], 'start': s.status().start_seconds, "
          f"'phase': s.status().job.phase if s.status().job else None, 'on_ranks': s.status().job.on_ranks() if s.status().job else None}})({SESSION})")
def view_summary(k: Kernel, parent: str, ex: Execution) -> str:
    """The summary line of the attach cell's status view as it settled (its last display), as a reader sees it."""
    msgs = ex.messages + [m for m in k.collect(1.0) if m["parent_header"].get("msg_id") == parent]
    htmls = [m["content"]["data"]["text/html"] for m in msgs if m["msg_type"] in ("display_data", "update_display_data")
             and "ddp-status" in m["content"].get("data", {}).get("text/html", "")]
    assert htmls, "the attach cell shows no status view"
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", htmls[-1].split("</summary>", 1)[0])).split())


@pytest.mark.parametrize("end", ["restart", "sigkill"])
def test_an_attached_job_keeps_the_ranks_clock(runtime: str, tmp_path, end: str) -> None:
    """An attached job's run time is the ranks': from when its cell reached them (in the first kernel), to its end (in the
    second, or while no kernel was attached: ``sigkill``, the job ends before the attach). ``job``, its repr, the attach
    cell's view, and the panel's data (the rank rows, ``pool started in``) each say it.
    Bounds from the test's own clock: the job ran at least from the first tick the test saw to the gate's removal, and
    at most from before its cell was sent to when the test saw it end."""
    gate = str(tmp_path / "gate")
    open(gate, "w").close()
    k1 = kernel(runtime)
    k2 = None
    try:
        k1.run(START, timeout=180).ok()
        started_in = k1.value(f"{SESSION}.pool.start_seconds")
        sent = time.monotonic()
        ex1 = k1.run(TICKS.format(n=N, at=AT, gate=gate), timeout=120).ok()
        assert wait_until(lambda: all(ticks(texts(k1, ex1.msg_id, ex1)).get(r) for r in (0, 1)), 60)
        seen = time.monotonic()  # the job runs (it ran before this)
        time.sleep(2.0)  # it waits at its gate meanwhile: a run of seconds, not of the attach's milliseconds
        if end == "restart":
            k1.km.restart_kernel(now=False)
            k1.run("%load_ext ddp_magic").ok()
            k2, k1 = k1, None
        else:
            kill(k1)
            os.unlink(gate)
            freed = time.monotonic()
            spools = [os.path.join(runtime, f"ddp-kept-{discovery_id(runtime)}", f"r{r}.out") for r in (0, 1)]
            assert wait_until(lambda: all(f"tick {N - 1}\n" in open(p).read() for p in spools), 60)
            assert wait_until(lambda: not discovery(runtime, discovery_id(runtime)).get("busy"), 60)  # both ranks' cells ended
            ended = time.monotonic()
            k2 = kernel(runtime)
        ex = k2.run("%ddp attach --out job", timeout=120).ok()
        if end == "restart":
            asked = time.monotonic()
            now = k2.value(CLOCKS)
            assert now["phase"] == "running" and now["on_ranks"] >= asked - seen, now  # not "starting", not from the attach
            assert all(state == "running" and seconds >= asked - seen for state, seconds in now["rows"]), now
            os.unlink(gate)
            freed = time.monotonic()
            assert k2.value("job.wait(120)") is True
            ended = time.monotonic()
        else:
            assert "ended while no kernel was attached" in ex.stdout, ex.stdout
            now = k2.value(CLOCKS)  # while the job takes in its end, or after: its run time is the ranks', never from the attach
            assert now["on_ranks"] is None or freed - seen <= now["on_ranks"] <= ended - sent, (now, freed - seen, ended - sent)
            assert k2.value("job.wait(120)") is True
        ran = k2.value("job.elapsed")
        assert freed - seen <= ran <= ended - sent, (freed - seen, ran, ended - sent)
        said = k2.run("job").ok().result
        assert said is not None and re.fullmatch(r"<Job cell \[\d+\] of the previous kernel \(attached in cell \[\d+\]\): done after "
                                                 + re.escape(clock_text(ran)) + ">", said), said
        after = k2.value(CLOCKS)
        assert after["start"] == started_in, after  # "pool started in": the pool's start, not the attach's
        assert all(state == "done" and freed - seen <= seconds <= ended - sent for state, seconds in after["rows"]), (after, freed - seen, ended - sent)
        view = view_summary(k2, ex.msg_id, ex)
        assert f"2 ranks ✓ {fmt_seconds(ran)}" in view, (view, ran)  # the cell and job.elapsed: one figure
        stop_and_check(k2, runtime)
    finally:
        for k in (k1, k2):
            if k is not None:
                k.shutdown()


IN_STEP = """%%ddp --bg --out job --keep
import os, time
for i in range({n}):
    print('tick', i, flush=True)
    dist.barrier()
    while i == {at} and os.path.exists({gate!r}):
        time.sleep(0.02)
    time.sleep(0.05)
('done', kept)
"""  # both ranks print tick i before either prints tick i + 1 (the barrier): their lines interleave in time


def test_a_replay_shows_the_ranks_lines_in_the_order_they_were_printed(runtime: str, tmp_path) -> None:
    """The ranks print in step while no kernel is attached; the next kernel's replay interleaves them as they were
    printed, as the live path does, not all of rank 1's lines, then all of rank 0's."""
    for round_ in range(2):
        gate = str(tmp_path / f"gate{round_}")
        open(gate, "w").close()
        k1 = kernel(runtime)
        k2 = None
        try:
            k1.run(START, timeout=180).ok()
            ex1 = k1.run(IN_STEP.format(n=40, at=30, gate=gate), timeout=120).ok()
            assert wait_until(lambda k=k1, ex=ex1: all(3 in ticks(texts(k, ex.msg_id, ex)).get(r, []) for r in (0, 1)), 60)
            kill(k1)
            first = texts(k1, ex1.msg_id, ex1)
            spools = [os.path.join(runtime, f"ddp-kept-{discovery_id(runtime)}", f"r{r}.out") for r in (0, 1)]
            assert wait_until(lambda spools=spools: all("tick 30\n" in open(p).read() for p in spools), 60)  # to tick 30 with no kernel
            k2 = kernel(runtime)
            ex = k2.run("%ddp attach --out job", timeout=120).ok()
            os.unlink(gate)
            assert k2.value("job.wait(120)") is True
            shown = [(int(r), int(i)) for r, i in TICK.findall(texts(k2, ex.msg_id, ex))]
            replayed = [(r, i) for r, i in shown if i <= 30]
            assert all(len([i for o, i in replayed if o == r]) >= 10 for r in (0, 1)), (ticks(first), shown)  # a replay of many lines
            where = {line: n for n, line in enumerate(shown)}
            for r, i in replayed:  # a tick is shown before the next-but-one tick of any rank: the two ranks' lines interleave
                later = [where[(o, i + 2)] for o in (0, 1) if (o, i + 2) in where]
                assert all(where[(r, i)] < n for n in later), f"rank {r}'s tick {i} is shown after tick {i + 2}: {shown}"
            stop_and_check(k2, runtime)
        finally:
            for k in (k1, k2):
                if k is not None:
                    k.shutdown()
