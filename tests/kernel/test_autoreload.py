"""Edits reach every rank (``%ddp autoreload``, docs/autoreload.md): real kernels, real 4-rank pools, files edited between cells.

Each module the ranks import lives in the kernel's working directory (the notebook's), which every rank has on its
sys.path; each test edits its own module, and every cell after an edit runs twice (the second run reloads nothing).
Here autoreload is on before the first import; tests/kernel/test_autoreload_order.py turns it on after the import (the
user's order), on a kept pool too. The Slurm counterparts (both nodes, a module shipped by value) are in tests/slurm/test_slurm_autoreload.py.
"""
from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from kernel_helper import Kernel

pytestmark = pytest.mark.kernel

MODEL_V1 = '''
import torch


def f():
    return 1


class Point:
    def __init__(self, x):
        self.x = x

    def twice(self):
        return self.x * 1


class Child(Point):
    def twice(self):
        return super().twice() + 100


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        return self.w * x * 1
'''
MODEL_V2 = MODEL_V1.replace("return 1", "return 2").replace("x * 1", "x * 2")
SESSION = "get_ipython().magics_manager.registry['DDPMagics'].session"


def write(path: Path, text: str) -> None:
    """A save from an editor: the new text, and an mtime that a coarse filesystem clock still tells apart."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(textwrap.dedent(text))
    if path.stat().st_mtime_ns == before:
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def start(k: Kernel, where: Path, n: int = 4) -> None:
    """The kernel in the notebook's directory (the ranks get it on their path), and a pool of n ranks."""
    k.run(f"import os; os.chdir({str(where)!r})").ok()
    k.run("%load_ext ddp_magic").ok()
    k.run(f"%%ddp -n {n}\nimport os, sys, torch, torch.distributed as dist\n"
          "from torch.nn.parallel import DistributedDataParallel as DDP\nrank = dist.get_rank()\nkept = rank + 100", timeout=180).ok()


def per_rank(k: Kernel) -> list:
    return k.value("list(_)")


@pytest.fixture(scope="module")
def k4(tmp_path_factory) -> Iterator[Kernel]:
    where = tmp_path_factory.mktemp("notebook")
    k = Kernel()
    k.where = where  # type: ignore[attr-defined]
    try:
        start(k, where)
        k.run("%ddp autoreload").ok()
        yield k
    finally:
        k.shutdown()


def test_an_edit_reaches_every_rank_and_the_model_keeps_its_state(k4):
    model = k4.where / "model.py"
    write(model, MODEL_V1)
    k4.run(
        "%%ddp\nimport model\nnet = DDP(model.Net())\nopt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)\n"
        "net(torch.ones(1)).sum().backward(); opt.step(); opt.zero_grad()\n"
        "p, c = model.Point(3), model.Child(3)\n"
        "before = (id(net), id(opt), opt.state[net.module.w]['momentum_buffer'].clone(), net.module.w.detach().clone())\n"
        "(model.f(), round(float(net(torch.ones(1)) / net.module.w), 6))"
    ).ok()
    assert per_rank(k4) == [(1, 1.0)] * 4
    write(model, MODEL_V2)
    for attempt in range(2):
        ex = k4.run(
            "%%ddp\nsame = (id(net), id(opt)) == before[:2] and torch.equal(opt.state[net.module.w]['momentum_buffer'], before[2])\n"
            "(model.f(), round(float(net(torch.ones(1)) / net.module.w), 6), same, torch.equal(net.module.w, before[3]))"
        ).ok()
        assert per_rank(k4) == [(2, 2.0, True, True)] * 4, ex.stdout
        said = [line for line in ex.stdout.splitlines() if line.startswith("ddp_magic: autoreload:")]
        assert said == (["ddp_magic: autoreload: reloaded model (model.py) on 4 ranks"] if attempt == 0 else []), ex.stdout  # once, one line
        status = k4.run("%ddp status").ok().stdout
        assert status.splitlines()[-1] == f"autoreload: on (%ddp autoreload); reloaded at the last cell: {'model' if attempt == 0 else 'none'}", status
    # the next training step runs the new forward (d/dw of 2·w·x is 2, not 1) and leaves the same weights on every rank
    k4.run("%%ddp\nnet(torch.ones(1)).sum().backward(); opt.step(); opt.zero_grad()\n"
           "(net.module.w.item(), (before[3] - 0.1 * (0.9 * before[2] + 2.0)).item())").ok()
    weights = per_rank(k4)
    assert len({w for w, _ in weights}) == 1 and weights[0][0] == pytest.approx(weights[0][1]), weights
    # an object made before the reload: IPython moved it to the new class; it pickles and comes back to the notebook
    for _ in range(2):
        k4.run("%%ddp\n(isinstance(p, model.Point), p.twice(), isinstance(c, model.Point), c.twice())").ok()  # super() too
        assert per_rank(k4) == [(True, 6, True, 106)] * 4
        ex = k4.run("%%ddp --ranks 0\np").ok()
        assert ex.result is not None and "[0] <model.Point at 0x" in ex.result, ex.result
        assert k4.value("[(type(v).__qualname__, v.twice()) for v in _]") == [("Point", 6)] * 4


def test_a_module_that_imports_an_edited_one_sees_the_new_code(k4):
    write(k4.where / "dep_a.py", "def k():\n    return 1\n")
    write(k4.where / "dep_b.py", "from dep_a import k\n\ndef g():\n    return k() * 10\n")
    k4.run("%%ddp\nimport dep_b\ndep_b.g()").ok()
    assert per_rank(k4) == [10] * 4
    write(k4.where / "dep_a.py", "def k():\n    return 2\n")
    for _ in range(2):
        k4.run("%%ddp\ndep_b.g()").ok()
        assert per_rank(k4) == [20] * 4


def test_a_model_under_fully_shard_runs_the_new_forward(k4):
    mod = k4.where / "fsdpmod.py"
    write(mod, "import torch\n\nclass Block(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
               "        self.lin = torch.nn.Linear(8, 8, bias=False)\n        torch.nn.init.ones_(self.lin.weight)\n\n"
               "    def forward(self, x):\n        return self.lin(x) * 1\n")
    k4.run("%%ddp\nimport fsdpmod\nfrom torch.distributed.fsdp import fully_shard\nblock = fully_shard(fsdpmod.Block())\n"
           "block_id = id(block)\nblock(torch.ones(1, 8)).sum().item()", timeout=120).ok()
    assert per_rank(k4) == [64.0] * 4
    write(mod, mod.read_text().replace("* 1", "* 2"))
    for _ in range(2):
        k4.run("%%ddp\n(block(torch.ones(1, 8)).sum().item(), id(block) == block_id)", timeout=120).ok()
        assert per_rank(k4) == [(128.0, True)] * 4


def test_a_syntax_error_is_one_error_naming_the_file_and_line_and_the_fix_runs(k4):
    mod = k4.where / "syntaxmod.py"
    write(mod, "def g():\n    return 'v1'\n")
    k4.run("%%ddp\nimport syntaxmod\nsyntaxmod.g()").ok()
    write(mod, "def g():\n    return 'v2'\n\ndef h(:\n    pass\n")
    for _ in range(2):
        ex = k4.run("%%ddp\nkept += 1\nsyntaxmod.g()")
        assert ex.error is not None and ex.error[0] == "UsageError", ex.error
        text = ex.error[1]
        assert text.startswith(f"autoreload: SyntaxError in {mod}, line 4; nothing ran, every rank keeps its state"), text
        assert "def h(:" in text and text.count("SyntaxError") == 1 and "rank" not in ex.stdout, (text, ex.stdout)
    write(mod, "def g():\n    return 'v2'\n")
    for _ in range(2):
        k4.run("%%ddp\n(syntaxmod.g(), kept - rank)").ok()
        assert per_rank(k4) == [("v2", 100)] * 4  # `kept += 1` never ran


def test_a_module_that_raises_as_it_reloads_fails_every_cell_until_fixed(k4):
    mod = k4.where / "raisemod.py"
    write(mod, "X = 1\n")
    k4.run("%%ddp\nimport raisemod\nraisemod.X").ok()
    write(mod, "X = 2\nundefined_thing\n")
    for _ in range(2):  # the old code never runs silently: the reload is tried again, and fails again
        ex = k4.run("%%ddp\nkept += 1\nraisemod.X")
        assert ex.error is not None and ex.error[0] == "CellError", ex.error
        text = ex.error[1]
        assert re.match(r"rank \d raised NameError: name 'undefined_thing' is not defined\n", text), text
        assert f"autoreload: reloading raisemod ({mod}) failed; the cell did not run, the rank keeps its state:" in text, text
        assert re.search(r"ranks [0-3, -]+ failed the same way", text), text
    write(mod, "X = 3\n")
    for _ in range(2):
        k4.run("%%ddp\n(raisemod.X, kept - rank)").ok()
        assert per_rank(k4) == [(3, 100)] * 4


def test_a_parameter_added_in_init_is_said_once_and_nothing_hangs(k4):
    mod = k4.where / "initmod.py"
    v1 = MODEL_V1.replace("return 1", "return 'v1'")
    write(mod, v1)
    k4.run("%%ddp\nimport initmod\nnet2 = DDP(initmod.Net())\nopt2 = torch.optim.SGD(net2.parameters(), lr=0.1)\nlen(list(net2.parameters()))").ok()
    write(mod, v1.replace("self.w = torch.nn.Parameter(torch.ones(1))",
                          "self.w = torch.nn.Parameter(torch.ones(1))\n        self.b = torch.nn.Parameter(torch.zeros(1))"))
    step = "%%ddp\nnet2(torch.ones(1)).sum().backward(); opt2.step(); opt2.zero_grad()\n(len(list(net2.parameters())), net2.module.w.item())"
    notice = ("ddp_magic: autoreload: initmod.Net.__init__ changed: objects made before keep what their old __init__ made (a model: its "
              "parameters and buffers, the same on every rank); rebuild the model and its DDP wrapper (net = DDP(initmod.Net())) to get the new ones")
    first = k4.run(step, timeout=60).ok()
    assert first.stdout.count(notice) == 1, first.stdout
    assert per_rank(k4) == [(1, pytest.approx(0.9))] * 4  # the old instance: its one parameter, trained alike on every rank
    again = k4.run(step, timeout=60).ok()
    assert "__init__ changed" not in again.stdout and per_rank(k4) == [(1, pytest.approx(0.8))] * 4
    for _ in range(2):
        k4.run("%%ddp\nnet2 = DDP(initmod.Net())\nnet2(torch.ones(1)).sum().backward()\nsorted(n for n, _ in net2.module.named_parameters())",
               timeout=60).ok()
        assert per_rank(k4) == [["b", "w"]] * 4


def test_a_rank_whose_file_differs_is_refused_by_name(k4):
    mod, local = k4.where / "localmod.py", k4.where / "rank1_only"
    local.mkdir()
    write(mod, "VERSION = 'v1'\n")
    write(local / "localmod.py", "VERSION = 'v1'\n")
    k4.run(f"%%ddp\nif rank == 1: sys.path.insert(0, {str(local)!r})  # a rank-local path entry\nimport localmod\n"
           "(localmod.VERSION, localmod.__file__)").ok()
    assert [Path(p).parent.name for _, p in per_rank(k4)] == [k4.where.name, "rank1_only", k4.where.name, k4.where.name]
    node = k4.value("__import__('socket').gethostname()")
    write(local / "localmod.py", "VERSION = 'v2'\n")  # only rank 1 sees the new file
    for _ in range(2):
        ex = k4.run("%%ddp\nkept += 1\nlocalmod.VERSION", timeout=60)
        assert ex.error is not None and ex.error[0] == "UsageError", ex.error
        lines = ex.error[1].splitlines()
        assert lines[0] == "autoreload: the ranks do not all have the notebook's version of a module; nothing ran, every rank keeps its state."
        assert re.fullmatch(rf"  localmod: the notebook's {re.escape(str(mod))} \(version [0-9a-f]{{8}}\)", lines[1]), lines
        assert re.fullmatch(rf"    rank 1 \(node {re.escape(node)}\): {re.escape(str(local / 'localmod.py'))} \(version [0-9a-f]{{8}}\)", lines[2]), lines
        assert len(lines) == 4 and lines[3].startswith("Make the file the same for every rank"), lines
    write(mod, "VERSION = 'v2'\n")  # now the notebook's file says the same: every rank reloads it
    for _ in range(2):
        k4.run("%%ddp\n(localmod.VERSION, kept - rank)").ok()
        assert per_rank(k4) == [("v2", 100)] * 4


def test_the_kernels_autoreload_turns_it_on_and_off_stops_it(tmp_path):
    k = Kernel()
    try:
        start(k, tmp_path, n=2)
        mod = tmp_path / "followmod.py"
        write(mod, "def f():\n    return 1\n")
        k.run("%load_ext autoreload\n%autoreload 2").ok()
        k.run("import followmod").ok()
        first = k.run("%%ddp\nimport followmod\nfollowmod.f()").ok()
        follows = ("ddp_magic: the kernel's %autoreload 2 is on: the ranks reload edited modules before each %%ddp cell too "
                   "(%ddp autoreload off opts out)")
        assert first.stdout.count(follows) == 1 and per_rank(k) == [1, 1], first.stdout
        write(mod, "def f():\n    return 2\n")
        for _ in range(2):
            ex = k.run("%%ddp\nfollowmod.f()").ok()
            assert per_rank(k) == [2, 2] and follows not in ex.stdout
            assert k.value("followmod.f()") == 2  # the kernel's own %autoreload 2, untouched
        assert "autoreload: on (following the kernel's %autoreload 2)" in k.run("%ddp status").ok().stdout
        assert k.run("%ddp autoreload off").ok().stdout.strip() == "autoreload: off (%ddp autoreload off)"
        write(mod, "def f():\n    return 3\n")
        for _ in range(2):
            k.run("%%ddp\nfollowmod.f()").ok()
            assert per_rank(k) == [2, 2]
        report = k.run("report = %ddp_env\nprint(repr(report))").ok().stdout
        assert report.rstrip().splitlines()[-1] == "autoreload: off (%ddp autoreload off)", report
        ex = k.run("%ddp autoreload maybe")
        assert ex.error is not None and ex.error[0] == "UsageError"
        assert k.run("%ddp autoreload on").ok().stdout.strip() == "autoreload: on (%ddp autoreload); reloaded at the last cell: none"
        for _ in range(2):
            k.run("%%ddp\nfollowmod.f()").ok()
            assert per_rank(k) == [3, 3]
        k.run("as_json = %ddp_env --json").ok()
        assert k.value("as_json['autoreload']") == "autoreload: on (%ddp autoreload); reloaded at the last cell: none"
    finally:
        k.shutdown()


def test_nothing_changed_costs_no_question_to_the_ranks(k4):
    """The warm path: a cell with nothing edited sends no VERSIONS (the ranks are asked only when a file changed)."""
    write(k4.where / "warmmod.py", "def f():\n    return 'warm'\n")
    k4.run("%%ddp\nimport warmmod\nwarmmod.f()").ok()
    assert "warmmod" in k4.value(f"sorted({SESSION}.autoreload.loaded)")  # the ranks told the kernel, it watches the file
    k4.run(f"{SESSION}.pool.hub.replies.pop('versions', None)").ok()
    for _ in range(2):
        k4.run("%%ddp\nwarmmod.f()").ok()
        assert per_rank(k4) == ["warm"] * 4 and k4.value(f"{SESSION}.pool.hub.replies.get('versions') is None")
