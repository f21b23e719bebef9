"""``python -m ddp_magic kept`` lists this user's kept pools; ``python -m ddp_magic stop ID`` ends one. From a terminal, no kernel needed.

A kept pool (``%ddp keep``, docs/keep.md) outlives its kernel until its lease runs out; this is the way to
see and end one without starting a notebook. Only the same Unix user finds them (0600 files in the
Jupyter runtime directory) and a stop proves the pool's secret to its template, as an attach does.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import List, Optional

from .kernel.keep import attach
from .wire import kept

STOP_WAIT_S = 10.0


def stop(pool_id: str) -> str:
    """End the kept pool ``pool_id`` (a prefix will do): its ranks, template and files go. Raises SystemExit with the reason."""
    pools = attach.found_pools()
    match = [p for p in pools if p.id.startswith(pool_id)] if pool_id else []
    if len(match) != 1:
        raise SystemExit(f"no kept pool {pool_id!r} of this user (or more than one starts so).\n{attach.list_text(pools)}")
    found = match[0]
    if found.data.get("state") == "ended" or not found.alive:
        attach.forget(found)
        return f"the kept pool {found.id} had ended already: {found.data.get('why') or 'its template died'}; its files are gone now"
    where = found.path.rsplit("/", 1)[0]
    with kept.dial_lease(attach.lease_at(found), bytes.fromhex(found.data["secret"]), STOP_WAIT_S) as sock:
        sock.sendall((json.dumps({"op": "stop"}) + "\n").encode())
        sock.recv(4096)
    deadline = time.monotonic() + STOP_WAIT_S
    while kept.is_held(kept.lock_path(found.id, where)) and time.monotonic() < deadline:
        time.sleep(0.05)
    attach.forget(found)
    return f"stopped the kept pool {found.id}: its ranks and template have exited, its files are gone"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddp_magic", description="this user's kept pools (docs/keep.md)")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("kept", help="list the kept pools of this user")
    stop_p = sub.add_parser("stop", help="end a kept pool: its ranks, template and files")
    stop_p.add_argument("id", help="the pool's id, as `kept` lists it (a prefix will do)")
    args = ap.parse_args(argv)
    if args.command == "kept":
        print(attach.list_text(attach.found_pools()))
    else:
        print(stop(args.id))
    return 0


if __name__ == "__main__":
    sys.exit(main())
