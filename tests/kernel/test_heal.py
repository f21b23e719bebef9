"""A rank started again alone comes back whole: before the next cell it gets the others' imports and every name they agree on.

A DDP training in the PyTorch tutorial's shape (ToyModel, SGD with momentum, a step counter, a train function) on 3
ranks; rank 1 is SIGKILLed after 5 steps. The next cell runs with no setup cell run again: the notice says what was
copied from rank 0 and names what was not (a name that differs by rank, a generator); on every rank the weights, the
optimizer's momentum and the step are bitwise those of a pool that trained 5 steps without the kill. After 5 more
steps every rank's weights are equal and an all_reduce is right; they match the uninterrupted run's to float
tolerance (not bitwise: the new rank's DDP buckets are laid out anew, on every rank alike, and gloo's ring adds up
each element in an order that follows its bucket). ``--no-heal`` is test_restarted_variables.py's.
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

SETUP = """%%ddp -n 3
import os, hashlib, torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))

torch.manual_seed(0)
model = DDP(ToyModel())
loss_fn = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
step = 0
rank = dist.get_rank()
pending = (i for i in range(3))

def train(n):
    global step
    for _ in range(n):
        g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
        x, y = torch.randn(20, 10, generator=g), torch.randn(20, 5, generator=g)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        step += 1

def digest(tensors):
    h = hashlib.sha256()
    for v in tensors:
        h.update(v.detach().numpy().tobytes())
    return h.hexdigest()

def state():
    momentum = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    return (digest(model.module.state_dict().values()), digest(momentum), step, os.getpid())
os.getpid()"""
STATE = "%%ddp\nstate()"
TRAIN = "%%ddp\ntrain(5)\nt = torch.ones(1)\ndist.all_reduce(t)\n(torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(), t.item())"


@pytest.fixture(scope="module")
def k() -> Iterator[Kernel]:
    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    yield k
    k.shutdown()


def kill_rank(k: Kernel, rank: int) -> int:
    pid = k.value("list(_)")[rank]
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(pid), 10)
    # the kernel has heard of it (the template's exit event): else the next cell meets the death mid-run instead
    assert wait_until(lambda: re.search(rf"rank {rank}: pid {pid} +dead", k.run("%ddp status").ok().stdout) is not None, 30)
    return pid


@pytest.mark.parametrize("run", [1, 2])
def test_a_killed_rank_is_healed_bitwise_and_trains_on(k: Kernel, run: int) -> None:
    k.run(SETUP.replace("%%ddp -n 3", "%%ddp -n 3 --restart"), timeout=180).ok()
    k.run("%%ddp\ntrain(5)", timeout=120).ok()
    at5 = k.value("[tuple(v) for v in _]") if k.run(STATE, timeout=60).ok() else None
    k.run(TRAIN, timeout=120).ok()
    at10 = k.value("[list(v[0]) for v in _]")  # 10 steps, no kill
    k.run(SETUP.replace("%%ddp -n 3", "%%ddp -n 3 --restart"), timeout=180).ok()
    k.run("%%ddp\ntrain(5)\nos.getpid()", timeout=120).ok()
    old = kill_rank(k, 1)
    ex = k.run(STATE, timeout=180).ok()  # no import, no setup: state() and what it reads are there
    notice = ex.stdout
    healed = r"rank 1 \(pid \d+\) was killed by SIGKILL[^\n]*: started it again in [^;]+; healed in [^:]+: \d+ names copied from rank 0 \("
    assert re.search(healed, notice), notice
    assert re.search(r"healed in [^(:]+\([\d.]+ [KM]iB of state through /dev/shm\)", notice), notice  # one host: not gloo's TCP
    assert re.search(r"\d+ names copied from rank 0 \(DDP, ToyModel, digest, dist, hashlib, loss_fn, model, nn, … 6 more\)", notice), notice
    assert "rank: it differs by rank" in notice and "pending: a generator" in notice, notice  # named, never dropped
    got = k.value("[tuple(v) for v in _]")
    assert got[1][3] != old and [g[:3] for g in got] == [a[:3] for a in at5], (got, at5)  # weights, momentum, step: bitwise
    k.run("%%ddp\ntype(model.module) is ToyModel and train.__globals__ is globals()", timeout=60).ok()
    assert k.value("list(_)") == [True] * 3, "the class and the function came as code, tied to the rank's own namespace"
    k.run(TRAIN, timeout=120).ok()
    after = k.value("[(list(v[0]), v[1]) for v in _]")
    assert [a[1] for a in after] == [3.0] * 3 and after[0][0] == after[1][0] == after[2][0], "every rank's weights are equal"
    assert all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(after[0][0], at10[0])), "the uninterrupted run's, to float tolerance"
    ex = k.run("%%ddp\nrank", timeout=120)  # a name the notice said it lacks: on rank 1 alone
    assert ex.error is not None and ex.error[1].startswith("rank 1 raised NameError: name 'rank' is not defined"), ex.error


def test_with_one_healthy_rank_only_what_is_the_same_by_construction_is_copied(k: Kernel) -> None:
    """Two ranks, rank 1 killed: rank 0 alone cannot show that a value is the same on every rank (``rank`` would come
    back 0 on rank 1). The imports, the functions and classes, the DDP model and its optimizer come (DDP keeps them
    equal); ``step``, an int, is named, not copied."""
    k.run(SETUP.replace("%%ddp -n 3", "%%ddp -n 2 --restart"), timeout=180).ok()
    k.run("%%ddp\ntrain(3)\nos.getpid()", timeout=120).ok()
    kill_rank(k, 1)
    ex = k.run("%%ddp\n(digest(model.module.state_dict().values()), 'step' in globals(), 'rank' in globals(), dist.get_rank())", timeout=180).ok()
    for name in ("step", "rank", "loss_fn"):
        assert f"{name}: only rank 0 kept its names, so whether it differs by rank cannot be told" in ex.stdout, ex.stdout
    got = k.value("[tuple(v) for v in _]")
    assert got[0][0] == got[1][0] and [g[1:] for g in got] == [(True, True, 0), (False, False, 1)], got


def test_a_name_that_differs_by_rank_comes_from_the_last_snapshot(k: Kernel, tmp_path) -> None:
    """After ``%ddp save``, a rank killed two steps later: ``rank`` (its own, not rank 0's) and its RNG states come from
    its file in that snapshot, and the notice says so with the snapshot's time; the generator is still named."""
    k.run(SETUP.replace("%%ddp -n 3", "%%ddp -n 3 --restart"), timeout=180).ok()
    k.run("%%ddp\ntrain(3)", timeout=120).ok()
    k.run(f"%ddp save {tmp_path}", timeout=180).ok()
    k.run("%%ddp\ntrain(2)\nos.getpid()", timeout=120).ok()
    kill_rank(k, 1)
    ex = k.run("%%ddp\n(rank, step, 'pending' in globals())", timeout=180).ok()
    assert re.search(r"copied from rank 0 \([^)]*\), 2 from the snapshot of \d\d:\d\d:\d\d \(rank, RNG states\)", ex.stdout), ex.stdout
    assert "pending: a generator" in ex.stdout and "rank: it differs" not in ex.stdout, ex.stdout
    assert k.value("[tuple(v) for v in _]") == [(0, 5, True), (1, 5, False), (2, 5, True)]  # step: the others' (5), not the snapshot's (3)


HOLD_HEAL = """%%ddp
import ddp_magic.procs.rank_heal as _rank_heal, time as _time
def _held_heal(ns, args, _heal=_rank_heal.heal):
    while not os.path.exists({gate!r}):  # the survivors' part of the heal waits: a Ctrl-C comes meanwhile
        _time.sleep(0.01)
    return _heal(ns, args)
_rank_heal.heal = _held_heal
os.getpid()"""


@pytest.mark.parametrize("run", [1, 2])
def test_ctrl_c_during_a_heal_stops_the_cell_before_it_runs(k: Kernel, tmp_path, run: int) -> None:
    """A Ctrl-C while a restarted rank is healed ends the cell there: the cell does not run on a rank left empty (it used
    to run on, and fail there with NameErrors); the next cell runs on every rank."""
    ran = tmp_path / "ran"
    k.run(SETUP.replace("%%ddp -n 3", "%%ddp -n 3 --restart"), timeout=180).ok()
    k.run(HOLD_HEAL.format(gate=str(tmp_path / "gate")), timeout=120).ok()
    kill_rank(k, 1)
    ex = k.run(f"%%ddp\nopen({str(ran)!r}, 'a').write('ran')", timeout=180, interrupt_after=3.0)
    said = ex.stdout + ex.stderr + str(ex.error)
    assert ex.error is not None and "the heal of rank 1 was interrupted: the cell did not run; run it again" in said, said
    assert not ran.exists(), "the cell ran after the interrupted heal"
    k.run("%%ddp\nimport torch.distributed as d\nt = __import__('torch').ones(1)\nd.all_reduce(t)\nint(t.item())", timeout=120).ok()
    assert k.value("list(_)") == [3, 3, 3]  # every rank in the one group


TIED = """%%ddp -n 2 --restart
import os, torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

class RNNModel(nn.Module):  # the official word_language_model's shape, with its tie_weights
    def __init__(self, ntoken=50, ninp=16):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, ninp)
        self.decoder = nn.Linear(ninp, ntoken)
        self.decoder.weight = self.encoder.weight

    def forward(self, x):
        out, _ = self.rnn(self.encoder(x))
        return self.decoder(out)

torch.manual_seed(0)
lm = DDP(RNNModel())
opt = torch.optim.SGD(lm.parameters(), lr=0.1, momentum=0.9)

def lm_step():
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randint(0, 50, (5, 2), generator=g)
    opt.zero_grad()
    nn.functional.cross_entropy(lm(x).view(-1, 50), x.view(-1)).backward()
    opt.step()

lm_step()
os.getpid()"""


def test_tied_weights_stay_one_tensor_on_a_healed_rank_and_train_alike(k: Kernel) -> None:
    """The healed rank takes the received tensors as its module's own (no copy); the encoder's and decoder's weight
    are one Parameter there too, so a step moves both alike on every rank."""
    k.run(TIED, timeout=180).ok()
    kill_rank(k, 1)
    ex = k.run("%%ddp\nlm_step()\nm = lm.module\n(m.decoder.weight is m.encoder.weight, len(list(m.parameters())), "
               "m.encoder.weight.sum().item(), len(opt.state))", timeout=180).ok()
    assert "healed in" in ex.stdout, ex.stdout
    got = k.value("[tuple(v) for v in _]")
    assert got[0] == got[1] and got[0][0] is True and got[0][3] == got[0][1], got
