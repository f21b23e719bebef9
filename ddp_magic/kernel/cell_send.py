"""A cell's RUN, pickled once and the same bytes sent to every rank: at 1,024 ranks one pickle per rank was a third of the send.

Nothing in a RUN is per rank: a rank reads its local rank (``--local_rank`` for a launch-era argparse parser) from its
own env (procs/rank_argv.py), so the default argv travels as None. The one field that differs between ranks is
``shm`` (whether the rank shares the kernel's /dev/shm), so there is one frame for the ranks on this host and one for
the others.
"""
from __future__ import annotations

import socket
from typing import Dict, List, Mapping, Optional, Sequence

from ..wire import protocol as P
from .hub import Hub
from .ranks import RankInfo


def run_fields(cell: int, source: str, filename: str, names: Dict[str, bytes], owned: Sequence[str], gather: str,
               argv: Optional[List[str]], reload: Optional[dict]) -> dict:
    """The RUN's fields every rank shares; ``argv`` None: torchrun's convention, the rank adds its own --local_rank where asked."""
    fields = dict(cell=cell, source=source, filename=filename, names=names, owned=sorted(owned), gather=gather,
                  argv=list(argv) if argv is not None else None)
    fields["named_marks"] = True  # DONE may name its quiet streams' earlier markers (hub_output.py reads them)
    if reload is not None:
        fields["reload"] = reload
    return fields


def send_run(hub: Hub, ranks: Mapping[int, RankInfo], nproc: int, fields: dict) -> None:
    """RUN to ranks 0..nproc-1: one pickle for the ranks on this host (``shm``) and one for the rest."""
    here = socket.gethostname()
    by_shm: Dict[bool, List[int]] = {}
    for rank in range(nproc):
        by_shm.setdefault(ranks[rank].host in ("", here), []).append(rank)
    for shm, members in by_shm.items():
        hub.broadcast(P.message(P.RUN, shm=shm, **fields), members)
