"""--save-on-preempt on an SSH pool across real hosts (the cluster in a box; docs/snapshots.md "Preemption").

A pool on n1 and n2 over ssh trains in a --bg job with a safe point a step. SIGTERM to n2's template, sent inside n2
(what a preemptible machine's agent or a ``kill`` there sends; not the template's parent-death signal, which its
sshd session's end sends): the armed ranks save at their next safe point, the job's cell says the step, the pool
ends on both hosts, and a new pool on both hosts loads that step with the weights of that step. Twice, the second
round from the pool the first one loaded. (tests/kernel/test_preempt_ssh.py does the same with a stand-in for ssh.)"""
from __future__ import annotations

import re
import time
from pathlib import Path

import box_fixtures
import box_ssh
import cluster_box
import pytest
from conftest import wait_until
from kernel_helper import Kernel
from test_box_ssh import _ours, _session_of, _stop, _use, _wait_gone

box = box_fixtures.box  # the fixtures, by name in this module
box_kernel = box_fixtures.box_kernel
ssh_login = box_fixtures.ssh_login

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

HOSTS = "--hosts n1,n2 --ntasks-per-node 1"
SETUP = f"""%%ddp {HOSTS}
import torch, torch.distributed as dist
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
torch.manual_seed(100 + dist.get_rank())  # each rank its own data
step, seen = 0, {{}}
"""
JOB = """%%ddp --bg --out job --save-on-preempt {folder}
import time, ddp_magic
while True:  # a safe point a step (ddp_magic.log), an end every rank agrees on
    step += 1
    x = torch.randn(16, 4)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    seen[step] = [p.detach().clone() for p in model.parameters()]
    ddp_magic.log(step=step, loss=loss.item())
    time.sleep(0.02)
    done = torch.tensor([float(step > 10**6)])
    dist.all_reduce(done)
    if done.item():
        break
"""
CHECK = "%%ddp --out after\nimport socket\n(socket.gethostname(), step, max(seen), all(bool((a == b).all()) for a, b in zip(seen[step], model.parameters())))"


def _said(k: Kernel, since: int) -> str:
    k.collect(0.2)
    return "".join(m["content"].get("text", "") for m in k.elsewhere[since:] if m["msg_type"] == "stream")


def _preempt_n2(b: cluster_box.Box, k: Kernel, folder: Path) -> int:
    """SIGTERM to n2's template from inside n2 during the job: the step said, once the pool is gone from both hosts."""
    since = len(k.elsewhere)
    k.run(JOB.format(folder=folder), timeout=60).ok()
    assert wait_until(lambda: len(k.value("job.metrics['step']")) > 20, timeout=180)
    assert k.armed(exists=lambda path: b.run("n2", ["test", "-e", path]).returncode == 0), "n2's ranks heard the arming"
    template = next(p for p in _ours(b, "n2") if p in _templates(b))
    ranks = [p for p in _ours(b, "n1") + _ours(b, "n2")]
    t0 = time.monotonic()
    b.run("n2", ["kill", "-TERM", str(template)], check=True)
    where = re.escape(str(folder))
    line = rf"preempted: saved step (\d+) to {where}/step-\S+ \(([\d.]+) s\); %ddp load {where} on the next allocation"
    assert wait_until(lambda: re.search(line, _said(k, since)) is not None or k.value("job.done()"), timeout=300)
    said_s = time.monotonic() - t0
    assert re.search(line, _said(k, since)), _said(k, since)[-3000:]
    k.run("job.wait()", timeout=300).ok()
    left = _wait_gone(ranks, 30)
    assert not left, f"the preempted pool left processes on the hosts: {left}"
    found = re.search(line, _said(k, since))
    assert found is not None
    print(f"SIGTERM to n2's template -> '{found.group(0)[:40]}…' said after {said_s:.1f} s (the save: {found.group(2)} s), "
          f"nothing of the pool left after {time.monotonic() - t0:.1f} s")
    return int(found.group(1))


def _templates(b: cluster_box.Box) -> list:
    """The pids of the hosts' templates (an sshd session's child; the ranks are the templates' children)."""
    out = []
    for node in ("n1", "n2"):
        session = _session_of(b, node)
        for pid in _ours(b, node):
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == session:
                    out.append(pid)
    return out


def test_sigterm_to_a_hosts_template_saves_and_the_next_pool_goes_on(box: cluster_box.Box, box_kernel: Kernel,
                                                                      ssh_login: box_ssh.Login, tmp_path: Path) -> None:
    _use(box_kernel, ssh_login)
    try:
        box_kernel.run(SETUP, timeout=240).ok()
        for attempt in range(2):
            folder = tmp_path / f"ckpt{attempt}"  # the box's hosts share the machine's /tmp
            step = _preempt_n2(box, box_kernel, folder)
            loaded = box_kernel.run(f"%ddp load {folder} {HOSTS}", timeout=300).ok()
            assert f"(step {step}, saved by 2 ranks) into 2 ranks" in loaded.stdout, loaded.stdout
            box_kernel.run(CHECK, timeout=120).ok()
            assert box_kernel.value("list(after)") == [("n1", step, step, True), ("n2", step, step, True)]
    finally:
        _stop(box_kernel)


def test_an_armed_hosts_ssh_session_killed_still_ends_it_at_once(box: cluster_box.Box, box_kernel: Kernel,
                                                                  ssh_login: box_ssh.Login, tmp_path: Path) -> None:
    """The template's parent-death signal is a SIGTERM too: its sshd session's end (the kernel's side of it) ends the
    host's template and ranks at once, armed or not; nothing is saved for it. ``%ddp stop`` then stops the armed pool."""
    _use(box_kernel, ssh_login)
    try:
        box_kernel.run(SETUP, timeout=240).ok()
        since = len(box_kernel.elsewhere)
        box_kernel.run(JOB.format(folder=tmp_path / "ckpt"), timeout=60).ok()
        assert wait_until(lambda: len(box_kernel.value("job.metrics['step']")) > 20, timeout=180)
        on_n2 = _ours(box, "n2")
        t0 = time.monotonic()
        box.run("n2", ["kill", "-KILL", str(_session_of(box, "n2"))], check=True)
        left = _wait_gone(on_n2, 30)
        assert not left, f"n2's template or ranks outlived their ssh session: {left}"
        print(f"armed, ssh session killed: n2's template and ranks gone after {time.monotonic() - t0:.1f} s")
        box_kernel.run("job.wait(120)", timeout=180).ok()
        assert "preempted" not in _said(box_kernel, since), _said(box_kernel, since)[-3000:]
        assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").iterdir())
        stopped = box_kernel.run("%ddp stop", timeout=60).ok()  # an armed pool's watcher is no cell: it was refused (turns.py)
        assert "stopped the pool" in stopped.stdout, stopped.stdout
    finally:
        _stop(box_kernel)
