"""Which ranks kept their variables: a rank started again alone has none of before, and no message says otherwise.

A rank is SIGKILLed; the next cell starts it again (its notice says its variables are gone) and uses a variable the
others have: it raises NameError there, the others are released from their collective and the group re-forms. The
cell's message and the panel's last-cell line (``LastCell.text``, what ``%ddp status`` and the panel say) name which
ranks kept their variables, never "your variables are intact". Once a cell has assigned every name it lost on it again,
a later re-formed group says every rank's variables are intact.
"""
from __future__ import annotations

import os
import re
import signal
from typing import Iterator

import pytest

from conftest import pid_alive, wait_until
from kernel_helper import Kernel

pytestmark = pytest.mark.kernel

START = "%%ddp -n 3\nimport os, torch, torch.distributed as dist\nx = dist.get_rank() + 1\nos.getpid()"
USE = "%%ddp\nt = torch.ones(1) * x\ndist.all_reduce(t)\nt.item()"
UNHEALED = USE.replace("%%ddp", "%%ddp --no-heal")  # as before healing: the rank starts empty (test_heal.py heals it)
RAISES = "%%ddp\nif dist.get_rank() == 2:\n    raise ValueError('rank 2 stops')\ndist.all_reduce(torch.ones(1))"
KEPT = "ranks 0, 2 kept their variables; rank 1 was started again: it lacks names the others have"


@pytest.fixture(scope="module")
def k() -> Iterator[Kernel]:
    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    yield k
    k.shutdown()


def test_a_restarted_rank_is_not_said_to_keep_its_variables(k: Kernel) -> None:
    k.run(START, timeout=180).ok()
    for round_ in range(2):
        pid = k.value("list(_)")[1]
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda pid=pid: not pid_alive(pid), 10)
        # the kernel has heard of it (the template's exit event): else the next cell meets the death mid-run instead
        assert wait_until(lambda pid=pid: re.search(rf"rank 1: pid {pid} +dead", k.run("%ddp status").ok().stdout) is not None, 30)
        ex = k.run(UNHEALED if round_ == 0 else USE, timeout=180)  # healed, rank 1 still lacks x: it differs by rank
        assert ex.error is not None and "NameError" in ex.error[1] and "rank 1" in ex.error[1], ex.error
        said = ex.stdout + ex.error[1]
        assert "started it again" in said, said
        assert "variables are intact" not in said and "the process group was re-formed in" in said, said
        assert f"; {KEPT}" in said, said
        status = k.run("%ddp status").ok().stdout
        assert f"recovered: every rank is ready; {KEPT}" in status and "variables intact" not in status, status
        k.run(START.replace("-n 3", ""), timeout=120).ok()  # every rank has them again
        assert k.run(USE, timeout=120).ok().result.splitlines()[1:] == ["  [0] 6.0", "  [1] 6.0", "  [2] 6.0"]
        ex = k.run(RAISES, timeout=180)  # rank 1 has every name again: a later re-formed group keeps everyone's
        assert ex.error is not None and "rank 2 raised ValueError" in ex.error[1], ex.error
        assert "; your variables are intact" in ex.error[1] and "started again" not in ex.error[1], ex.error[1]
        k.run("%%ddp\nos.getpid()", timeout=120).ok()
