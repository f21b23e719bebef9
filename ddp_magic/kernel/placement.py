"""Where a pool's ranks will run, settled before any starts: a scheduler's allocation, the control address, the TLS key.

For one host this is nothing: loopback, plain TCP. A Slurm pool first waits for its
allocation (``Launcher.acquire``), and while the job is queued every rank is shown
QUEUED with Slurm's words ("queued: job 1234 pending (Resources)") and the time
waited, in the status view, the panel and the status bar alike. Ctrl-C there cancels
the job (the launcher's ``acquire`` does it); any failure leaves the ranks STOPPED.
Then the control channel gets an address the nodes reach (never every interface) and,
for ranks on other hosts, TLS; once it listens, the plan learns MASTER_ADDR (the first
node's address) and a MASTER_PORT that is not the control port (``Launcher.placed``).
A node of the allocation whose ranks went silent (kernel/failures/unreachable.py) is pinged
first: one still silent fails the start within seconds, naming it, not after the join timeout.
"""
from __future__ import annotations

import time
from typing import Dict, NamedTuple, Optional

from ..errors import StartError
from ..plan.plan import Plan
from ..plan.spec import PoolSpec
from ..states import RankState
from ..wire.tls import ServerKey, TlsError
from .failures.unreachable import raise_if_start_silent
from .launchers import LaunchError, Launcher
from .ranks import Listener, RankInfo


class Place(NamedTuple):
    """What the start of a pool listens on: an address the ranks reach, and the TLS key if they are on other hosts."""

    listen_addr: str
    tls_key: Optional[ServerKey]


def place(launcher: Launcher, spec: PoolSpec, plan: Plan, ranks: Dict[int, RankInfo], listener: Listener) -> Place:
    """Acquire what the ranks run on (queued ranks shown meanwhile); a refusal is a StartError in the scheduler's words."""

    def queued(text: str) -> None:
        for info in ranks.values():
            info.state, info.last_line = RankState.QUEUED, text
            listener.on_state(info)

    try:
        where = launcher.acquire(plan, queued)
        raise_if_start_silent(launcher, plan)  # a node of the allocation held whose ranks went silent: asked first
        addr = launcher.listen_addr(spec.listen_addr, spec.control_addr)
        key = launcher.tls_server()
    except (LaunchError, TlsError) as e:
        _stopped(ranks, listener)
        raise StartError(str(e)) from None
    except BaseException:  # Ctrl-C while queued (the launcher cancelled the job), a node still silent
        _stopped(ranks, listener)
        raise
    now = time.monotonic()
    for info in ranks.values():
        if info.state == RankState.QUEUED:  # the job started: the ranks' own clock starts now
            info.state, info.last_line, info.started = RankState.STARTING, "", now
            listener.on_state(info)
    if where:
        listener.on_notice(where)
    return Place(addr, key)


def _stopped(ranks: Dict[int, RankInfo], listener: Listener) -> None:
    for info in ranks.values():
        info.state, info.finished = RankState.STOPPED, time.monotonic()
        listener.on_state(info)
