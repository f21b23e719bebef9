"""%%ddp --hosts across real hosts over SSH (the cluster in a box: an sshd in each node, the test's own key, known_hosts
and ssh config; n2 reached only through a ProxyJump over n1).

DDP trains on both hosts with identical weights, from --hosts and from a DeepSpeed hostfile; an interrupt ends a cell
and the ranks keep their state; --bg and --peek; a SIGKILLed kernel leaves nothing on n1 or n2; a killed sshd session
ends its host's template and ranks (the next cell starts them again); a changed host key and a host without ddp_magic
are refused by name with nothing started. Each twice, as a notebook user runs a cell again."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import box_fixtures
import box_ssh
import cluster_box
import pytest
import test_faults
from conftest import LOST_LINK
from kernel_helper import Kernel, alive

box = box_fixtures.box  # the fixtures, by name in this module
box_kernel = box_fixtures.box_kernel
ssh_login = box_fixtures.ssh_login

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

HOSTS = "%%ddp --hosts n1,n2 --ntasks-per-node 2"
TRAIN = box_fixtures.DDP_TRAIN + """print(f"trained {dist.get_rank()}")
(socket.gethostname(), os.environ.get('GLOO_SOCKET_IFNAME'), w.tolist(), os.getpid())
"""
SESSION = "get_ipython().magics_manager.registry['DDPMagics'].session"


def _use(k: Kernel, login: box_ssh.Login) -> None:
    """The kernel's ssh reads this test's config (ssh takes ~/.ssh from the passwd entry, not $HOME: -F)."""
    k.run(f"import os; os.environ['DDP_MAGIC_SSH_ARGS'] = '-F {login.config}'").ok()


def _stop(k: Kernel) -> None:
    k.run("%ddp stop", timeout=60).ok()
    k.run("import os; os.environ.pop('DDP_MAGIC_SSH_ARGS', None)").ok()


def _values(k: Kernel, ex) -> list:
    ex.ok()
    return k.value("[tuple(v) for v in _]") if ex.result else []


def _ours(b: cluster_box.Box, node: str) -> List[int]:
    """The pids of ddp_magic's processes in ``node`` (its ssh template and the ranks forked from it)."""
    out = []
    for pid in b.processes():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(b"ddp_magic.procs.ssh_template" in a for a in argv) and _in_host(b, pid, node):
            out.append(pid)
    return out


def _in_host(b: cluster_box.Box, pid: int, node: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/net") == os.readlink(f"/proc/{b.anchor(node)}/ns/net")
    except OSError:
        return False


def _wait_gone(pids: List[int], seconds: float) -> List[int]:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.mark.parametrize("how", ["--hosts", "--hostfile", "uneven"])
def test_ddp_trains_on_two_hosts_over_ssh(box: cluster_box.Box, box_kernel: Kernel, ssh_login: box_ssh.Login, tmp_path: Path, how: str) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# the box's nodes, DeepSpeed's format\nn1 slots=2\n\nn2 slots=2   # through n1 (ProxyJump)\n")
    head = {"--hosts": HOSTS, "--hostfile": f"%%ddp --hostfile {hostfile}", "uneven": "%%ddp --hosts n1:3,n2:1"}[how]
    where = ["n1", "n1", "n1", "n2"] if how == "uneven" else ["n1", "n1", "n2", "n2"]
    _use(box_kernel, ssh_login)
    try:
        for _attempt in range(2):
            ex = box_kernel.run(head + TRAIN, timeout=240)
            assert ex.error is None, f"{ex.error}\n{ex.stdout[-3000:]}\n{ex.stderr[-3000:]}"
            values = _values(box_kernel, ex)
            assert [v[0] for v in values] == where, values
            assert {v[1] for v in values} == {"mgmt0"}, "each host chose the interface on its route to MASTER_ADDR"
            assert all(v[2] == values[0][2] for v in values), "identical weights on every rank"
            assert "[rank 3 n2] trained 3" in ex.stdout and f"[rank 2 {where[2]}] trained 2" in ex.stdout, ex.stdout
        env = box_kernel.run("%ddp_env", timeout=60).ok().result or ""
        assert f"MASTER_ADDR={box.host('n1').mgmt}" in env.replace("'", "").replace(": ", "="), env
        status = box_kernel.run("%ddp status", timeout=60).ok().stdout
        shape = "n1:3,n2:1" if how == "uneven" else "n1:2,n2:2"
        assert f"2 hosts over SSH ({shape}), python {sys.executable}: n1 ({box.host('n1').mgmt}), n2 ({box.host('n2').mgmt})" in status, status
    finally:
        _stop(box_kernel)
    left = _wait_gone(_ours(box, "n1") + _ours(box, "n2"), 15)
    assert not left, f"%ddp stop left processes on the hosts: {left}"


def test_an_interrupt_ends_the_cell_and_the_ranks_keep_their_state(box: cluster_box.Box, box_kernel: Kernel, ssh_login: box_ssh.Login) -> None:
    _use(box_kernel, ssh_login)
    try:
        box_kernel.run(HOSTS + "\nimport torch.distributed as dist\nkept = dist.get_rank() * 10", timeout=240).ok()
        for _attempt in range(2):
            ex = box_kernel.run("%%ddp\nimport time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.05)", timeout=120,
                                interrupt_after=4.0)
            assert ex.error is not None and "KeyboardInterrupt" in ex.error[0] + ex.error[1] + "".join(ex.error[2]), ex.error
            assert "[rank 3 n2] looping" in ex.stdout, ex.stdout
            assert box_kernel.run("%%ddp\nkept", timeout=120).ok().result == "RankResults(4 ranks):\n  [0] 0\n  [1] 10\n  [2] 20\n  [3] 30"
        kept = box_kernel.run("%ddp keep", timeout=60).ok()  # an SSH pool can be kept (test_box_ssh_keep.py), and unkept
        assert "kept pool" in kept.stdout, kept.stdout
        box_kernel.run("%ddp keep --off", timeout=60).ok()
        assert box_kernel.run("%%ddp\nkept", timeout=120).ok().result.endswith("[3] 30")
    finally:
        _stop(box_kernel)


BG = """%%ddp --bg --out job
import time, torch.distributed as dist
for step in range(40):
    time.sleep(0.1)
dist.get_rank()
"""


def test_bg_and_peek_on_two_hosts(box: cluster_box.Box, box_kernel: Kernel, ssh_login: box_ssh.Login) -> None:
    _use(box_kernel, ssh_login)
    try:
        box_kernel.run(HOSTS + "\nstep = -1", timeout=240).ok()
        for _attempt in range(2):
            box_kernel.run(BG, timeout=120).ok()
            deadline, seen = time.monotonic() + 60, ""
            while time.monotonic() < deadline:
                seen = box_kernel.run("%%ddp --peek\nstep", timeout=60).ok().result or ""
                if re.fullmatch(r"RankResults\(4 ranks\):\n(  \[\d\] ([1-9]\d*)\n?){4}", seen):
                    break
                time.sleep(0.2)
            assert re.fullmatch(r"RankResults\(4 ranks\):\n(  \[\d\] ([1-9]\d*)\n?){4}", seen), seen
            assert box_kernel.value("job.wait(120)") is True
            assert box_kernel.value("list(job.result())") == [0, 1, 2, 3]
    finally:
        _stop(box_kernel)


@pytest.mark.parametrize("how", ["SIGKILL", "shutdown", "restart"])
def test_a_kernels_end_leaves_nothing_on_the_hosts(box: cluster_box.Box, ssh_login: box_ssh.Login, how: str) -> None:
    """A SIGKILLed kernel, a kernel shut down, a kernel restarted: nothing of ours on n1 or n2 within seconds."""
    for _attempt in range(2):
        k = box_fixtures.login_kernel(box, DDP_MAGIC_SSH_ARGS=f"-F {ssh_login.config}")
        try:
            k.run(HOSTS + "\nimport os\nos.getpid()", timeout=240).ok()
            ours = _ours(box, "n1") + _ours(box, "n2")
            assert len([p for p in ours if _in_host(box, p, "n1")]) >= 3 and len([p for p in ours if _in_host(box, p, "n2")]) >= 3, ours
            t0 = time.monotonic()
            if how == "SIGKILL":
                os.kill(k.pid, signal.SIGKILL)
            elif how == "shutdown":
                k.km.shutdown_kernel(now=False)
            else:
                k.km.restart_kernel(now=False)
            left = _wait_gone(ours, 30)  # the promise: seconds (the session's end reaches each template; the beat's silence at 12 s)
            assert not left, f"left on the hosts after the kernel's {how}: {left}"
            print(f"kernel {how}: nothing of ours on n1 or n2 after {time.monotonic() - t0:.1f} s")
        finally:
            k.kc.stop_channels()
            k.km.shutdown_kernel(now=True)
        assert not _ours(box, "n1") + _ours(box, "n2")


def _session_of(box: cluster_box.Box, node: str) -> int:
    """The sshd session process whose command is ``node``'s template (the template's parent)."""
    for pid in _ours(box, node):
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{ppid}/comm") as f:
            if f.read().startswith("sshd"):
                return ppid
    raise AssertionError(f"no sshd session runs a template on {node}")


def test_a_killed_ssh_session_ends_its_template_and_the_next_cell_starts_that_host_again(
        box: cluster_box.Box, box_kernel: Kernel, ssh_login: box_ssh.Login) -> None:
    _use(box_kernel, ssh_login)
    try:
        box_kernel.run(HOSTS + "\nimport torch.distributed as dist\nkept = dist.get_rank() * 10", timeout=240).ok()
        for _attempt in range(2):
            on_n2 = _ours(box, "n2")
            os.kill(_session_of(box, "n2"), signal.SIGKILL)  # sshd's side of the connection, gone
            t0 = time.monotonic()
            left = _wait_gone(on_n2, 30)  # the promise: at once (the template's parent-death signal), its ranks with it
            assert not left, f"n2's template or ranks outlived their ssh session: {left}"
            print(f"ssh session killed: n2's template and ranks gone after {time.monotonic() - t0:.1f} s")
            ex = box_kernel.run("%%ddp\nimport socket\n(socket.gethostname(), globals().get('kept'))", timeout=240).ok()
            values = box_kernel.value("[tuple(v) for v in _]")
            assert values == [("n1", 0), ("n1", 10), ("n2", None), ("n2", None)], (values, ex.stdout)
            box_kernel.run("%%ddp\nimport torch.distributed as dist\nkept = dist.get_rank() * 10", timeout=120).ok()
    finally:
        _stop(box_kernel)


def _changed_key(login: box_ssh.Login) -> None:
    """n1's entry in this login's known_hosts replaced by another key: n1 now shows a key ssh has never seen for it."""
    other = box_ssh._keygen(os.path.join(os.path.dirname(login.known_hosts), "not_n1"))
    lines = Path(login.known_hosts).read_text().splitlines()
    n1 = lines[0].split(" ", 1)[0]
    Path(login.known_hosts).write_text("\n".join([f"{n1} {other.rsplit(' ', 1)[0]}"] + lines[1:]) + "\n")


def test_a_changed_host_key_is_refused_by_name_and_nothing_starts(box: cluster_box.Box, box_kernel: Kernel, ssh_login: box_ssh.Login) -> None:
    _changed_key(ssh_login)
    _use(box_kernel, ssh_login)
    try:
        for _attempt in range(2):
            ex = box_kernel.run(HOSTS + "\n1", timeout=240)
            assert ex.error is not None and ex.error[0] == "StartError", ex.error
            said = ex.error[1]
            assert "n1: its host key changed since you last connected" in said and "ssh-keygen -R n1" in said, said
            assert "no rank was started on any host" in said, said
            assert not _ours(box, "n1") + _ours(box, "n2"), "nothing runs on any host"
            env = box_kernel.run("%ddp_env --hosts n1,n2 --ntasks-per-node 2", timeout=120).ok()
            assert "host n1" in env.stdout + (env.result or "") and "host key changed" in env.stdout + (env.result or ""), env.stdout
    finally:
        _stop(box_kernel)


def _ddp_magic_copies() -> List[str]:
    """Where a host's python finds ddp_magic: this checkout (the kernel's PYTHONPATH) and the installed one."""
    found = subprocess.run([sys.executable, "-c", "import ddp_magic, os; print(os.path.dirname(ddp_magic.__file__))"], cwd="/",
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, capture_output=True, text=True).stdout.strip()
    return sorted({str(Path(__file__).resolve().parents[2] / "ddp_magic"), *([found] if found else [])})


def test_a_host_without_ddp_magic_is_refused_by_name(box: cluster_box.Box, box_kernel: Kernel, ssh_login: box_ssh.Login) -> None:
    """n2's file system lacks ddp_magic (an empty folder mounted over each copy there alone): n2 is named, n1 is not."""
    copies = _ddp_magic_copies()
    for copy in copies:
        box.run("n2", ["mount", "-t", "tmpfs", "-o", "size=1m", "no-ddp-magic", copy], check=True)
    _use(box_kernel, ssh_login)
    try:
        for _attempt in range(2):
            ex = box_kernel.run(HOSTS + "\n1", timeout=240)
            assert ex.error is not None and ex.error[0] == "StartError", ex.error
            said = ex.error[1]
            assert "n2: no ddp_magic for" in said and "n1:" not in said, said
            assert not _ours(box, "n1") + _ours(box, "n2"), "nothing runs on any host"
    finally:
        for copy in copies:
            box.run("n2", ["umount", copy], check=True)
    try:  # with ddp_magic back on n2, %ddp_env asks each host and starts nothing
        env = box_kernel.run("%ddp_env --hosts n1,n2 --ntasks-per-node 2", timeout=120).ok()
        shown = env.stdout + (env.result or "") + box_kernel.run("print(_.full_text())").ok().stdout
        assert "planned env for 4 ranks on 2 hosts over SSH, backend gloo" in shown, shown
        assert re.search(r"✓ host n2: n2: python \S+, ddp_magic [\d.]+, torch \S+ \(the same code as here\)", shown), shown
        assert "✓ n1 reaches the kernel" in shown and "✓ n2 reaches the kernel" in shown, shown
        assert f"MASTER_ADDR={box.host('n1').mgmt}" in shown, shown
        assert not _ours(box, "n1") + _ours(box, "n2"), "%ddp_env started nothing"
    finally:
        _stop(box_kernel)


def test_a_host_lost_mid_collective_is_named_and_its_ranks_come_back(box: cluster_box.Box, box_kernel: Kernel, ssh_login: box_ssh.Login) -> None:
    """n2's link goes down mid all_reduce: n2 and its ranks are named (the control channel's liveness, as on Slurm), n1's
    ranks keep their state; with the link back, the next cell starts n2's ranks again (a new session if its went)."""
    _use(box_kernel, ssh_login)
    try:
        for _attempt in range(2):
            box_kernel.run(HOSTS + "\nimport os, torch, torch.distributed as dist\nkept = (dist.get_rank(), os.getpid())", timeout=240).ok()
            try:
                text, took = test_faults._during(box_kernel, test_faults.LOOP, lambda: test_faults._link(box, "n2", False))
            finally:
                test_faults._link(box, "n2", True)
            assert text.splitlines()[0] == f"CellError: ranks 2-3 on n2 are unreachable: {LOST_LINK}", text
            # n1's ranks are never blamed: they appear only where the forensics say where each rank was when released
            # (under load they may be one all_reduce apart: "rank 0 was in all_reduce #305, rank 1 in … #304, and were released")
            blamed = [ln for ln in text.splitlines() if re.search(r"\branks? [01]\b", ln) and not ln.startswith("  ")  # a table row
                      and not ln.rstrip().endswith("and were released")]
            assert not blamed, text
            assert took < 45, f"n2 was named {took:.1f}s after its link went down"  # promise: within about 15 s (docs/multinode.md); 3x
            print(f"n2's link down: named after {took:.1f} s")
            again = box_kernel.run(test_faults.AGAIN, timeout=240).ok()
            # healed across hosts from rank 0: the imports come, `kept` (100 + rank, on ranks 0-1) is named, not copied
            said = again.stdout
            assert re.search(r"healed in [^:]+: \d+ names copied from rank 0 \([^)]*\bdist\b", said) and "kept: it differs by rank" in said, said
            values = again.results[-1]
            assert values.count("4.0") == 4 and "(0, " in values and "(1, " in values and values.count("None") == 2, values
    finally:
        _stop(box_kernel)


def test_the_kernels_host_losing_its_network_leaves_nothing_on_the_hosts(box: cluster_box.Box, box_kernel: Kernel, ssh_login: box_ssh.Login) -> None:
    """login's link goes down with a pool idle: no ssh session ends (sshd never hears of it), yet every template hears
    no beat and ends its ranks and itself; the link back, %ddp stop has nothing left to end there."""
    _use(box_kernel, ssh_login)
    try:
        for _attempt in range(2):
            box_kernel.run(HOSTS + "\nimport os\nos.getpid()", timeout=240).ok()
            ours = _ours(box, "n1") + _ours(box, "n2")
            assert ours
            test_faults._link(box, "login", False)
            t0 = time.monotonic()
            try:
                left = _wait_gone(ours, 45)  # the promise: the template's silence (12 s), then at once; 3x
            finally:
                test_faults._link(box, "login", True)
            assert not left, f"left on the hosts while the kernel's host was cut off: {left}"
            print(f"the kernel's host cut off: nothing of ours on n1 or n2 after {time.monotonic() - t0:.1f} s")
            box_kernel.run("%ddp stop", timeout=120).ok()
            deadline = time.monotonic() + 30  # the link back: login's neighbour entries for the nodes come back
            while time.monotonic() < deadline and box.run("login", ["ssh", "-F", ssh_login.config, "n2", "true"], timeout=30).returncode:
                time.sleep(0.5)
    finally:
        _stop(box_kernel)


def test_a_taken_master_port_on_the_first_host_is_refused_by_name(box: cluster_box.Box, box_kernel: Kernel, ssh_login: box_ssh.Login) -> None:
    holder = subprocess.Popen(box.enter("n1") + [sys.executable, "-c", "import socket, time\ns = socket.socket()\n"
                              "s.bind(('0.0.0.0', 29533)); s.listen(); print('held', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    _use(box_kernel, ssh_login)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for _attempt in range(2):
            ex = box_kernel.run(HOSTS + " --master-port 29533\n1", timeout=240)
            assert ex.error is not None and ex.error[0] == "StartError", ex.error
            assert "n1: MASTER_PORT 29533 is taken there" in ex.error[1] and "n2:" not in ex.error[1], ex.error[1]
            assert not _ours(box, "n1") + _ours(box, "n2"), "nothing runs on any host"
    finally:
        holder.kill()
        holder.wait()
        _stop(box_kernel)
