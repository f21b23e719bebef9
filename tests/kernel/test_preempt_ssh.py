"""--save-on-preempt on an SSH pool (docs/snapshots.md "Preemption"), with test_keep_ssh.py's stand-in for ssh.

The stand-in execs the remote command here, so each host's template is the child of the kernel's anchor, as a remote
template is sshd's session's: a SIGTERM to the second host's template while that parent lives is one from outside (a
``kill``, a preemptible machine's agent), not its parent-death signal. The armed ranks save at their next safe point,
the job's cell says the step, the pool ends, and a new pool on both hosts loads that step with its values.
(tests/cluster/test_box_preempt.py does the same over real ssh in the cluster in a box.)"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from conftest import wait_until
from kernel_helper import Kernel, alive, drop_runtime_dir, own_runtime_dir
from keep_helper import runtime_processes
from test_keep_ssh import FAKE_SSH
from test_snapshots import JOB, SETUP

from ddp_magic.wire.node_hello import BEAT_S, SILENCE_S

pytestmark = pytest.mark.kernel

HOSTS = "%%ddp --hosts ha,hb --ntasks-per-node 1\n"


@pytest.fixture
def ssh_kernel(tmp_path: Path) -> Iterator[Kernel]:
    """A kernel whose ssh is the stand-in, with a runtime directory of its own (its templates are found by it)."""
    runtime = own_runtime_dir()
    (tmp_path / "ssh").write_text(FAKE_SSH)
    (tmp_path / "ssh").chmod(0o755)
    path = os.pathsep.join([str(tmp_path), os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    k = Kernel(extra_env={"JUPYTER_RUNTIME_DIR": runtime, "PATH": path})
    k.run("%load_ext ddp_magic").ok()
    k.runtime = runtime  # type: ignore[attr-defined]
    try:
        yield k
    finally:
        k.run("%ddp stop", timeout=60)
        k.shutdown()
        drop_runtime_dir(runtime)


def _template_of(runtime: str, node: str) -> int:
    """The pid of ``node``'s ssh template (its command line names it)."""
    for pid in runtime_processes(runtime, b"ddp_magic.procs.ssh_template"):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if f"--node\0{node}\0".encode() in f.read() + b"\0":
                return pid
    raise AssertionError(f"no template for {node}")


def test_sigterm_to_an_ssh_hosts_template_saves_at_a_safe_point_and_a_new_pool_goes_on(ssh_kernel: Kernel, tmp_path: Path) -> None:
    k, folder = ssh_kernel, tmp_path / "ckpt"
    k.run(HOSTS + SETUP, timeout=240).ok()
    job = JOB.format(every="", stop=str(tmp_path / "never")).replace("--save-every 1s \n", f"--save-on-preempt {folder}\n")
    k.run(job, timeout=60).ok()
    assert wait_until(lambda: len(k.value("job.metrics['step']")) > 20, timeout=120)
    assert k.armed(), "the ranks heard the arming (a SIGTERM before it ends the pool unsaved)"
    template = _template_of(k.runtime, "hb")  # type: ignore[attr-defined]
    t0 = time.monotonic()
    os.kill(template, signal.SIGTERM)
    k.run("job.wait()", timeout=300).ok()
    said = "".join(m["content"].get("text", "") for m in k.elsewhere if m["msg_type"] == "stream")
    where = re.escape(str(folder))
    preempted = re.search(rf"preempted: saved step (\d+) to {where}/step-\S+ \([\d.]+ s\); %ddp load {where} on the next allocation", said)
    assert preempted, said[-3000:]
    print(f"SIGTERM to hb's template -> the job ended with the line said: {time.monotonic() - t0:.1f} s")
    assert wait_until(lambda: not runtime_processes(k.runtime, b"ddp_magic.procs.ssh_template"), 30)  # type: ignore[attr-defined]
    step = int(preempted.group(1))
    loaded = k.run(f"%ddp load {folder} --hosts ha,hb --ntasks-per-node 1", timeout=240).ok()
    assert f"(step {step}, saved by 2 ranks) into 2 ranks" in loaded.stdout, loaded.stdout
    k.run("%%ddp --out after\n(step, max(seen))", timeout=120).ok()
    assert k.value("list(after)") == [(step, step), (step, step)]


def test_a_template_held_up_past_its_silence_reads_the_waiting_beats_and_a_sigterm_unarmed_is_named(ssh_kernel: Kernel) -> None:
    """A host's template stopped for longer than its silence (a starved machine: SIGSTOP here) while the kernel beats on
    into its pipe reads those beats before it judges the kernel silent: its ranks live on with their variables. A
    SIGTERM to it with no rank armed ends its ranks at once, and their death names why, as the template said it first."""
    k = ssh_kernel
    k.run("%%ddp --hosts ha,hb --ntasks-per-node 1\nimport os\nx = int(os.environ['RANK']) * 10", timeout=240).ok()
    template = _template_of(k.runtime, "hb")  # type: ignore[attr-defined]
    os.kill(template, signal.SIGSTOP)
    time.sleep(SILENCE_S + 3)
    os.kill(template, signal.SIGCONT)
    time.sleep(2 * BEAT_S)  # a few turns of its loop: the old one ended the ranks on its first
    assert alive(template), "the template ended after its stop, though the kernel's beats waited in its pipe"
    k.run("%%ddp --out xs\nx", timeout=60).ok()
    assert k.value("list(xs)") == [0, 10], "both ranks kept their variables"

    os.kill(template, signal.SIGTERM)
    assert wait_until(lambda: not alive(template), 30)
    ex = k.run("%%ddp\nimport os\nos.environ['RANK']", timeout=240)
    said = ex.stdout + "".join(ex.error[2] if ex.error else [])
    assert re.search(r"rank 1 \(pid \d+\) [^:\n]+: hb's template ended its ranks: it was sent SIGTERM", said), said[-3000:]
