"""What a front end says it holds of a kept pool's output: where ``%ddp attach`` replays each rank from.

The kernel's ``shown`` file counts what a kernel handed to ipykernel; a SIGKILL can fall between that and ZeroMQ's
send (docs/keep.md). Each stream message of a kept pool's lines carries how far its lines go
(kernel/output/kept_output.py), and a front end that keeps the highest it received (the JupyterLab extension) tells
the next kernel over the ``ddp_magic`` comm (ui/labcomm.py): ``{"type": "shown", "pool": ID, "upto": {"0": [stdout,
stderr], ...}}``, or a list of those as ``shown`` in its ``hello``. The last word per pool counts; attach takes it
over the file's count for each rank it names, and the file's count for the others (a front end without the
extension says nothing: today's count).
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

from ...logs import log

_held: Dict[str, Dict[int, List[int]]] = {}
_lock = threading.Lock()


def heard(data: Any) -> bool:
    """A front end's ``shown`` message (a dict); whether it was one. A malformed one is logged and dropped."""
    try:
        pool, upto = str(data["pool"]), data["upto"]
        offsets = {int(rank): [int(pair[0]), int(pair[1])] for rank, pair in upto.items()}
        if any(n < 0 for pair in offsets.values() for n in pair):
            raise ValueError("a negative offset")
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        log.debug("a front end's shown message is malformed: %r", data, exc_info=True)
        return False
    with _lock:
        _held[pool] = offsets
    return True


def held(pool_id: str) -> Optional[Dict[int, List[int]]]:
    """Per rank, the [stdout, stderr] offsets the front end last said it holds of ``pool_id``; None if it said nothing."""
    with _lock:
        offsets = _held.get(pool_id)
        return {r: list(p) for r, p in offsets.items()} if offsets else None


def forget(pool_id: str) -> None:
    with _lock:
        _held.pop(pool_id, None)
