#!/usr/bin/env python
"""The floor of a result return: memcpy of n tensors of a size into fresh memory, in one process (``torch.empty_like(x).copy_(x)``).

Run as a child (``python bench/memcpy.py --combos "2,64;4,256" --repeats 5``), so torch's
threads and memory are its own; prints one BENCHJSON line. ``memcpy_baseline`` runs it
and puts the samples in a Store under ``result.memcpy.n{n}.s{size}`` (by repeat).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Dict, List, Tuple

import processes as P
from harness import MIB, PY, Store, short_error


def child(combos: List[Tuple[int, int]], repeats: int, untouched: bool) -> None:
    import torch

    res: Dict[str, List[float]] = {}
    for n, size in combos:
        elems = size * MIB // 4
        xs = [torch.empty(elems) if untouched else torch.empty(elems).fill_(1.0) for _ in range(n)]
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            ys = [torch.empty_like(x).copy_(x) for x in xs]
            times.append(time.perf_counter() - t0)
            del ys
        res[f"{n},{size}"] = times
        del xs
    print("BENCHJSON " + json.dumps({"memcpy": res, "threads": torch.get_num_threads()}), flush=True)


def memcpy_baseline(combos: List[Tuple[int, int]], repeats: int, untouched: bool, store: Store) -> None:
    """The child's samples into ``store``; a failure becomes every combination's error."""
    if not combos:
        return
    argv = [PY, os.path.abspath(__file__), "--combos", ";".join(f"{n},{s}" for n, s in combos), "--repeats", str(repeats)]
    try:
        got = P.child_json(argv + (["--untouched"] if untouched else []), timeout=600)
        for combo, times in got["memcpy"].items():
            n, s = combo.split(",")
            store.add(f"result.memcpy.n{n}.s{s}", times)
        store.notes.append(f"memcpy baseline: one process, torch.get_num_threads() = {got['threads']}, fresh destination memory")
    except Exception as e:
        for n, s in combos:
            store.error(f"result.memcpy.n{n}.s{s}", short_error(e))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--combos", required=True, help="n,MiB pairs separated by ';'")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--untouched", action="store_true", help="the source tensors are a bare torch.empty (pages not in memory yet)")
    a = ap.parse_args()
    child([(int(n), int(s)) for n, s in (c.split(",") for c in a.combos.split(";"))], a.repeats, a.untouched)
