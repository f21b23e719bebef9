#!/usr/bin/env python
"""Across real hosts: the cluster in a box (scripts/cluster_box.py), against the floors of its network.

    .venv/bin/python bench/bench_cluster.py                  # 3 repeats; needs root: it builds the box, starts the one-host Slurm
    .venv/bin/python bench/bench_cluster.py --repeats 5 --before main   # also ddp_magic as committed at main (git archive)

In one run, every figure a median (min–max) over the repeats, the ways interleaved within each repeat:

- **floors** (bench/cluster_wire.py): 256 MiB from a process on n2 to one on login, over the management
  network: plain TCP (``sendall`` → ``recv_into`` fresh memory), and the same through Python's ``ssl``, one
  thread each side;
- **the control channel alone**: the rank's pack and ``Channel.send``, the hub's reader and unpack, plain and TLS;
- **a cell's result**: a 256 MiB tensor returned by the rank on n2 to a pool's kernel process on login: a
  ``%%ddp --slurm`` pool (TLS, as every Slurm pool whose nodes are other hosts) and a ``--nnodes 2`` pool by hand
  (torchrun on login and n2, plain TCP); ratios to the floors;
- **warm cell** (an all_reduce, 2 nodes × 2 tasks): the box's Slurm (n1, n2: TLS) against the one-host Slurm
  (scripts/local_slurm.py, both nodes this machine: plain TCP, and TLS forced);
- **link down → named error**: n2's management link cut while 4 ranks loop over all_reduces: the time from the
  cut to the cell's end, the text the cell says, and what the next cell says once the link is back.

With ``--before REV`` the result rows, the channel alone and the warm cell run ddp_magic as committed at REV too,
in the same repeats: before and after side by side. ``--only-warm``: the warm cell rows alone (a latency change).
Writes bench/results/cluster.md and .json (docs/bench/cluster.md holds a run).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

from harness import write_report  # bench/ is sys.path[0] when this runs as a script

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "scripts"))
PY = sys.executable
OUT = os.path.join(HERE, "results", "cluster")
MIB = 256
SLURM_LOCK = "/tmp/ddp_slurm.lock"


def med(values: List[float], fmt: str = "{:.2f}") -> str:
    if not values:
        return "not run"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def rate(values: List[float]) -> str:
    """MiB/s of each sample (MIB / seconds), as median (min–max)."""
    return med([MIB / v for v in values], "{:,.0f}") if values else "not run"


def env_for(src: str, **extra: str) -> Dict[str, str]:
    env = dict(os.environ, PYTHONPATH=src, PATH=os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", ""))
    env.update(extra)
    return env


def wire(box, way: str, src: str) -> Tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """One transfer of MIB MiB from n2 to login (bench/cluster_wire.py): seconds, the receiver's and the sender's CPU seconds."""
    script = os.path.join(HERE, "cluster_wire.py")
    env = env_for(src)
    rx = subprocess.Popen(box.enter("login", cwd=REPO) + [PY, script, "recv", way, str(MIB)], stdout=subprocess.PIPE, text=True, env=env)
    tx = None
    try:
        assert rx.stdout is not None
        port, fingerprint = rx.stdout.readline().split()
        tx = subprocess.Popen(box.enter("n2", cwd=REPO) + [PY, script, "send", way, str(MIB), box.host("login").mgmt, port, fingerprint],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert tx.stdin is not None and tx.stdout is not None
        time.sleep(0.5)  # connected, its buffer made
        tx.stdin.write("go\n")
        tx.stdin.flush()
        t0 = float(tx.stdout.readline())
        t1, rx_cpu = map(float, rx.stdout.readline().split())
        tx.stdin.write("end\n")
        tx.stdin.flush()
        return t1 - t0, rx_cpu, float(tx.stdout.readline())
    finally:
        for p in (tx, rx):
            if p is not None:
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def pool_child(box, args: List[str], src: str, host: str = "login", timeout: float = 900, **extra: str) -> dict:  # type: ignore[no-untyped-def]
    """One bench/cluster_pool.py run on ``host`` (its own process, as a fresh kernel): its BENCHJSON. It runs in ``src``,
    so the ranks' ``python -m`` (the current directory first on their path) import that tree's ddp_magic too."""
    prefix = box.enter(host, cwd=src) if box is not None else []
    env = env_for(src, **extra)
    if box is not None:
        env.update(box.env())
    out = subprocess.run(prefix + [PY, os.path.join(HERE, "cluster_pool.py"), *args], capture_output=True, text=True, timeout=timeout,
                         env=env, cwd=src)
    for line in out.stdout.splitlines():
        if line.startswith("BENCHJSON "):
            return json.loads(line[len("BENCHJSON "):])
    raise RuntimeError(f"cluster_pool.py {args[0]} failed (exit {out.returncode}): {(out.stderr or out.stdout)[-1500:]}")


def archive(rev: str, into: str) -> str:
    """ddp_magic as committed at ``rev``, unpacked into ``into`` (the checkout is not touched)."""
    tar = subprocess.run(["git", "-C", REPO, "archive", rev, "ddp_magic"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=tar, check=True)
    return into


WIRE_WAYS = (("tcp", "floor.tcp"), ("ssl", "floor.ssl"), ("channel", "chan.tcp"), ("channel-tls", "chan.tls"))


def measure(box, g: Dict[str, List[float]], failed: Dict[str, str], key: str, fn) -> Optional[dict]:  # type: ignore[no-untyped-def]
    """One sample into ``g[key]``; a failure is kept by its key (the table says so) and the run goes on."""
    try:
        return fn()
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError, AssertionError) as e:
        failed[key] = " ".join(str(e).split())[-600:]  # the end: the exception's own line
        return None


def one_repeat(box, a: argparse.Namespace, g: Dict[str, List[float]], failed: Dict[str, str], texts: Dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    login = box.host("login").mgmt
    for tag, src in [] if a.only_warm else a.sources:
        n2 = json.dumps(box.enter("n2", cwd=src))  # the other node's agent: its ranks import this tree's ddp_magic too
        for way, key in WIRE_WAYS:
            if tag and way.startswith(("tcp", "ssl")):
                continue  # the floors do not depend on ddp_magic's code
            r = measure(box, g, failed, tag + key, lambda way=way, src=src: wire(box, way, src))
            if r is not None:
                g[tag + key].append(r[0])
                g[tag + key + ".cpu"].append(r[1] + r[2])
        for mode, key, extra in (("result-slurm", "result.tls", []), ("result-manual", "result.tcp", [n2, login])):
            r = measure(box, g, failed, tag + key, lambda mode=mode, extra=extra, src=src: pool_child(box, [mode, str(MIB), str(a.results)] + extra, src))
            if r is not None:
                g[tag + key].append(statistics.median(r["seconds"]))
                texts[tag + key] = f"hosts {r['hosts']}, TLS {r['tls']}"
    for tag, src in a.sources:  # the trees alternate within a repeat, so a slow moment of the machine hits both
        r = measure(box, g, failed, tag + "warm.box", lambda src=src: pool_child(box, ["warm", "2", "2", str(a.warm), "--exclude=n3"], src))
        if r is not None:
            g[tag + "warm.box"].append(r["ms"])
            texts[tag + "warm.box"] = f"hosts {r['hosts']}, TLS {r['tls']}"
        for key, force in (("warm.local", "0"), ("warm.local_tls", "1")):
            r = measure(None, g, failed, tag + key,
                        lambda force=force, src=src: pool_child(None, ["warm", "2", "2", str(a.warm)], src, DDP_MAGIC_FORCE_TLS=force))
            if r is not None:
                g[tag + key].append(r["ms"])


def link_row(box, g: Dict[str, List[float]], failed: Dict[str, str], texts: Dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    r = measure(box, g, failed, "link", lambda: pool_child(box, ["link-down", box.port("n2", "mgmt"), str(os.getpid())], REPO))
    if r is not None and r.get("seconds") is not None:
        g["link"].append(r["seconds"])
        texts["link"], texts["link.after"] = r["text"], r.get("after", "")
    elif r is not None:
        failed["link"] = r["text"]


def ratio(g: Dict[str, List[float]], key: str, floor: str) -> str:
    """The floor's time ÷ this way's, repeat by repeat (the two were measured in the same repeat, so a slow moment of
    the machine hits both), as median (min–max): 1.00× is the floor's throughput."""
    pairs = [f / v for f, v in zip(g.get(floor, []), g.get(key, []))]
    return med(pairs, "{:.2f}") + "×" if pairs and len(g[floor]) == len(g[key]) else "–"  # a failed sample would misalign them


def table(g: Dict[str, List[float]], a: argparse.Namespace, failed: Dict[str, str], texts: Dict[str, str], notes: List[str]) -> str:
    rows = [f"The box's hosts on one machine; {MIB} MiB from n2 to login over the management bridge; median (min–max) of {a.repeats}."]
    if not a.only_warm:
        rows += [
            "",
            "| way | s | MiB/s | ÷ its floor (throughput) | CPU s, both ends |",
            "|---|---|---|---|---|",
            f"| floor: plain TCP (`sendall` → `recv_into` fresh memory) | {med(g['floor.tcp'])} | {rate(g['floor.tcp'])} | 1.00× "
            f"| {med(g['floor.tcp.cpu'])} |",
            f"| floor: Python's `ssl`, one thread a side (TLS 1.3) | {med(g['floor.ssl'])} | {rate(g['floor.ssl'])} | 1.00× "
            f"| {med(g['floor.ssl.cpu'])} |",
        ]
    for tag, _src in [] if a.only_warm else a.sources:
        name = f" ({tag.rstrip('.')})" if tag else ""
        rows += [
            f"| control channel alone{name}, plain TCP | {med(g[tag + 'chan.tcp'])} | {rate(g[tag + 'chan.tcp'])} | {ratio(g, tag + 'chan.tcp', 'floor.tcp')} "
            f"| {med(g[tag + 'chan.tcp.cpu'])} |",
            f"| control channel alone{name}, TLS | {med(g[tag + 'chan.tls'])} | {rate(g[tag + 'chan.tls'])} | {ratio(g, tag + 'chan.tls', 'floor.ssl')} "
            f"| {med(g[tag + 'chan.tls.cpu'])} |",
            f"| a cell's result{name}, `--nnodes 2` by hand (plain TCP) | {med(g[tag + 'result.tcp'])} | {rate(g[tag + 'result.tcp'])} "
            f"| {ratio(g, tag + 'result.tcp', 'floor.tcp')} | – |",
            f"| a cell's result{name}, `--slurm` (TLS) | {med(g[tag + 'result.tls'])} | {rate(g[tag + 'result.tls'])} "
            f"| {ratio(g, tag + 'result.tls', 'floor.ssl')} | – |",
        ]
    rows += [
        "",
        f"| warm cell (an all_reduce, 2 nodes × 2 tasks), ms, median of {a.warm} a repeat | box: n1, n2 (TLS) | one-host Slurm (plain) "
        "| one-host Slurm (TLS forced) | box − one-host (plain) | the same, repeat by repeat |",
        "|---|---|---|---|---|---|",
    ]
    for tag, _src in a.sources:
        box, local = g[tag + "warm.box"], g[tag + "warm.local"]
        gap = statistics.median(box) - statistics.median(local) if box and local else float("nan")
        paired = med([b - c for b, c in zip(box, local)], "{:+.1f}") if box and len(box) == len(local) else "–"  # a slow moment hits both
        rows.append(f"| {tag.rstrip('.') or 'this tree'} | {med(box, '{:.1f}')} | {med(local, '{:.1f}')} "
                    f"| {med(g[tag + 'warm.local_tls'], '{:.1f}')} | {gap:+.1f} | {paired} |")
    rows += [
        "",
        f"Link down → named error (n2's management link cut while 4 ranks loop over all_reduces): {med(g['link'])} s from the cut "
        "to the cell's end.",
    ]
    if texts.get("link"):
        rows += ["", "What the cell said:", "", "```", texts["link"], "```", "", "The next cell, the link back up:", "", "```",
                 texts.get("link.after", ""), "```"]
    notes = notes + [f"{key}: {texts[key]}" for key in sorted(texts) if not key.startswith("link")]
    notes += [f"{key}: failed or not run: {why}" for key, why in failed.items()]
    return "\n".join(rows + [""] + [f"- {n}" for n in notes])


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--results", type=int, default=3, help="result cells per pool, their median one sample (default 3)")
    p.add_argument("--warm", type=int, default=50, help="warm cells per measurement (default 50)")
    p.add_argument("--before", metavar="REV", help="also measure ddp_magic as committed at REV (the result rows, the channel, the warm cell)")
    p.add_argument("--only-warm", action="store_true", help="only the warm cell rows (and the link row unless --skip-link)")
    p.add_argument("--skip-link", action="store_true", help="no link-down row")
    a = p.parse_args(argv)
    import cluster_box
    import local_slurm

    with tempfile.TemporaryDirectory(prefix="ddp_bench_cluster_") as tmp:
        a.sources = [("", REPO)] + ([(f"{a.before}.", archive(a.before, tmp))] if a.before else [])
        fd = cluster_box.take_lock(SLURM_LOCK)  # the one-host Slurm is shared: one user at a time
        try:
            print(local_slurm.start(), flush=True)
            box = cluster_box.Box()
            try:
                print(box.up(), flush=True)
                return run(box, a)
            finally:
                box.down()
        finally:
            os.close(fd)


def run(box, a: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    subprocess.run([PY, "-c", "import torch"], check=True)  # the page cache holds torch for every way alike
    keys = [t + k for t, _ in a.sources for k in ("chan.tcp", "chan.tcp.cpu", "chan.tls", "chan.tls.cpu", "result.tcp", "result.tls",
                                                   "warm.box", "warm.local", "warm.local_tls")]
    g: Dict[str, List[float]] = {k: [] for k in keys + ["floor.tcp", "floor.tcp.cpu", "floor.ssl", "floor.ssl.cpu", "link"]}
    failed: Dict[str, str] = {}
    texts: Dict[str, str] = {}
    load = os.getloadavg()[0]
    for i in range(a.repeats):
        one_repeat(box, a, g, failed, texts)
        print(f"repeat {i + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in g.items() if v), flush=True)
    if not a.skip_link:
        link_row(box, g, failed, texts)
    notes = [f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (other work on the machine skews every figure)"]
    text = table(g, a, failed, texts, notes)
    write_report(OUT, text, {"args": {k: v for k, v in vars(a).items() if k != "sources"}, "results": g, "failed": failed, "texts": texts,
                             "table": text})
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
