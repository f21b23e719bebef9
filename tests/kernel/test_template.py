"""The template outlives pools (real kernel): started at %load_ext, adopted by the first pool, kept across -n changes."""
from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import pid_alive, wait_until
from ddp_magic.procs.forkserver import SPARE_IDLE_S
from kernel_helper import Kernel

pytestmark = pytest.mark.kernel

SESSION = "get_ipython().magics_manager.registry['DDPMagics'].session"
PARENTS = "import os\nos.getppid()"  # a forked rank's parent is the template


def parents(k: Kernel, line: str) -> list:
    k.run(f"%%ddp {line}\n{PARENTS}", timeout=180).ok()
    return k.value("list(_)")


def test_the_template_started_at_load_ext_is_the_first_pools(kernel: Kernel) -> None:
    warm = kernel.value(f"{SESSION}.template.pid")
    assert isinstance(warm, int) and pid_alive(warm), "%load_ext started a template"
    assert wait_until(lambda: kernel.value("'torch' in __import__('sys').modules"), 60, 0.2), "and the kernel's own import of torch"
    assert parents(kernel, "-n 2") == [warm, warm]
    assert kernel.value(f"{SESSION}.template.pid is None") is True, "the pool adopted it"


def test_a_cell_importing_torch_right_after_load_ext_never_waits_on_the_warm_up() -> None:
    """The most common next cell, sent at once: the kernel's own warm-up import of torch must not race it (two
    threads importing torch at once deadlocked the kernel)."""
    k = Kernel()
    try:
        k.run("%load_ext ddp_magic").ok()
        for _ in range(2):  # the second run: torch already imported
            ex = k.run("import torch, torch.distributed as dist\nprint(dist.is_available())", timeout=120).ok()
            assert ex.stdout == "True\n"
    finally:
        k.shutdown()


def test_the_template_stays_across_size_changes(kernel: Kernel) -> None:
    template = parents(kernel, "-n 2")[0]
    for n in (4, 2, 2, 3):  # 2 twice: the second run of the same cell
        ex = kernel.run(f"%%ddp -n {n}\n{PARENTS}", timeout=180).ok()
        assert kernel.value("list(_)") == [template] * n
        if n != 2 or "restarting" in ex.stdout:  # notices are on stdout
            assert "pool started in" in ex.stdout and "from the same template" in ex.stdout, ex.stdout
            assert "variables defined in earlier %%ddp cells are gone" in ex.stdout
    ex = kernel.run("%ddp restart -n 2", timeout=180).ok()
    assert "from the same template" in ex.stdout and "pool of 2" in ex.stdout
    assert parents(kernel, "") == [template, template]


def test_a_changed_import_variable_gets_a_new_template(kernel: Kernel) -> None:
    old = parents(kernel, "-n 2")[0]
    kernel.run("import os\nos.environ['PYTORCH_DDP_MAGIC_TEST'] = '1'").ok()  # read by nothing, but PYTORCH_* is read at import
    ex = kernel.run(f"%%ddp -n 3\n{PARENTS}", timeout=180).ok()
    new = kernel.value("list(_)")
    assert len(set(new)) == 1 and new[0] != old and not pid_alive(old)
    assert "with a new template (PYTORCH_DDP_MAGIC_TEST changed)" in ex.stdout, ex.stdout  # a notice: stdout
    assert parents(kernel, "-n 2") == [new[0]] * 2, "and that one is kept again"


def test_stop_stops_the_template_and_the_next_cell_starts_one(kernel: Kernel) -> None:
    template = parents(kernel, "-n 2")[0]
    assert "stopped the pool" in kernel.run("%ddp stop").ok().stdout
    assert wait_until(lambda: not pid_alive(template), 10)
    again = parents(kernel, "-n 2")
    assert len(set(again)) == 1 and again[0] != template


def children(pid: int) -> set:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return {int(p) for p in f.read().split()}


def test_spare_ranks_forked_while_idle_become_the_next_pools_ranks(kernel: Kernel) -> None:
    template = parents(kernel, "-n 2")[0]
    for _ in range(2):  # a second round: the spares are forked again
        kernel.run("%%ddp\nos.getpid()").ok()
        ranks = set(kernel.value("list(_)"))
        time.sleep(SPARE_IDLE_S + 1.5)  # idle: the template forks spares for the most ranks a pool asked for
        spares = children(template) - ranks
        assert len(spares) >= 2, (children(template), ranks)
        kernel.run("%%ddp -n 3\nimport os\nos.getpid()", timeout=180).ok()
        new = set(kernel.value("list(_)"))
        assert len(new & spares) >= 2, "the new ranks are the spares (no fork on the way)"
        assert parents(kernel, "") == [template] * 3
        parents(kernel, "-n 2")


def test_a_kernel_that_never_runs_a_cell_leaves_no_template() -> None:
    k = Kernel()
    try:
        k.run("%load_ext ddp_magic").ok()
        template = k.value(f"{SESSION}.template.pid")
        assert pid_alive(template)
        os.kill(k.pid, signal.SIGKILL)
        assert wait_until(lambda: not pid_alive(template), 15), "the template dies with its kernel"
    finally:
        k.shutdown()


def test_a_sigterm_to_the_template_names_itself_in_its_ranks_deaths(kernel: Kernel) -> None:
    """SIGTERM to the pool's template (a ``kill``, no rank armed for a save) ends its ranks at once; the cell after says
    that is how they died, not only "killed by SIGKILL", which the OOM killer would say too. Twice: a new template
    serves the next pool."""
    for _attempt in range(2):
        template = parents(kernel, "-n 2")[0]
        os.kill(template, signal.SIGTERM)
        assert wait_until(lambda t=template: not pid_alive(t), 30)
        ex = kernel.run("%%ddp\n1", timeout=180)
        said = ex.stdout + "".join(ex.error[2] if ex.error else [])
        assert "its template ended its ranks: it was sent SIGTERM" in said, said[-3000:]
        kernel.run("%ddp stop", timeout=60).ok()
