"""The cold-start job outside a kernel, the same for every launcher: torchrun, mp.spawn, N bare processes, one bare import.

Each rank inits the process group, all_reduces ``torch.ones(1)`` and writes one
timestamped ``RESULT`` line; a start is timed from launch until the last rank's
line (launch → every process's exit goes in the sample's info). bench_core.py
and bench_peers.py both take their floors from here.
"""
from __future__ import annotations

import os
import subprocess
import time
from typing import List, Optional, Tuple

import processes as P
from harness import PY, Store, free_port, log, short_error

SPAWN_JOB = r'''
import os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp

def job(rank, n, port, backend):
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    t = torch.ones(1, device=torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu"))
    dist.all_reduce(t)
    os.write(1, f"RESULT {time.time()!r} {t.item()}\n".encode())
    dist.destroy_process_group()

if __name__ == "__main__":
    n, port, backend = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    mp.spawn(job, args=(n, port, backend), nprocs=n)
'''


def dev_expr(backend: str, rank_expr: str) -> str:
    return f"torch.device('cuda', {rank_expr})" if backend == "nccl" else "torch.device('cpu')"


def script_job(backend: str) -> str:
    """torchrun and bare processes: env:// init, one all_reduce, a timestamped result line."""
    dev = dev_expr(backend, "int(os.environ['LOCAL_RANK'])")
    return (
        "import os, time, torch, torch.distributed as dist\n"
        f"backend = {backend!r}\n"
        "if backend == 'nccl': torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
        "dist.init_process_group(backend)\n"
        f"t = torch.ones(1, device={dev})\n"
        "dist.all_reduce(t)\n"
        "os.write(1, f'RESULT {time.time()!r} {t.item()}\\n'.encode())  # one write: ranks share the pipe\n"
        "dist.destroy_process_group()\n"
    )


def write_jobs(tmp: str, backend: str) -> dict:
    """The scripts in ``tmp``: {"job": torchrun's and the bare ranks', "spawn": mp.spawn's}."""
    paths = {"job": os.path.join(tmp, "job.py"), "spawn": os.path.join(tmp, "spawn_job.py")}
    for key, text in (("job", script_job(backend)), ("spawn", SPAWN_JOB)):
        with open(paths[key], "w") as f:
            f.write(text)
    return paths


def parse_results(out: str, n: int) -> List[float]:
    """Every rank's RESULT timestamp; raises unless all n ranks printed the all_reduced n."""
    times = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "RESULT":
            if float(parts[2]) != float(n):
                raise RuntimeError(f"all_reduce gave {parts[2]}, expected {n}")
            times.append(float(parts[1]))
    if len(times) != n:
        raise RuntimeError(f"{len(times)} of {n} ranks printed a result")
    return times


def torchrun_argv(n: int) -> List[str]:
    torchrun = os.path.join(os.path.dirname(PY), "torchrun")
    return ([torchrun] if os.path.exists(torchrun) else [PY, "-m", "torch.distributed.run"]) + ["--standalone", f"--nproc-per-node={n}"]


def launch_bare(n: int, src: str, cwd: Optional[str] = None) -> Tuple[float, float, str]:
    """The floor: n `python -c src` ranks started together with the torch env set by hand.

    Returns (launch time, exit time, every rank's stdout); raises with a rank's stderr if one fails.
    """
    port = free_port()
    procs = []
    t_launch = time.time()
    try:
        for r in range(n):
            env = P.child_env()
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n))
            procs.append(subprocess.Popen([PY, "-c", src], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd or P.SRC,
                                          start_new_session=True, text=True))
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            if p.returncode != 0:
                raise RuntimeError(f"rank exit {p.returncode}: {P.tail(err, 300)}")
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                P.killpg(p)
    return t_launch, time.time(), "\n".join(outs)


def cold_script(kind: str, n: int, rep: int, backend: str, store: Store, paths: dict) -> None:
    """torchrun --standalone or mp.spawn: launch → the last rank's result line."""
    def one() -> Tuple[float, dict]:
        argv = torchrun_argv(n) + [paths["job"]] if kind == "torchrun" else [PY, paths["spawn"], str(n), str(free_port()), backend]
        t_launch = time.time()
        code, out, err = P.run_proc(argv)
        t_exit = time.time()
        if code != 0:
            raise RuntimeError(f"exit {code}: {P.tail(err, 300)}")
        try:
            times = parse_results(out, n)
        except RuntimeError as e:
            raise RuntimeError(f"{e}; stdout: {P.tail(out, 200)!r}; stderr: {P.tail(err, 300)!r}") from None
        return max(times) - t_launch, {"exit_s": t_exit - t_launch}

    store.measure(f"cold.{kind}.n{n}", one, rep)


def cold_bare(n: int, rep: int, backend: str, store: Store) -> None:
    src = script_job(backend)

    def one() -> Tuple[float, dict]:
        t_launch, t_exit, out = launch_bare(n, src)
        return max(parse_results(out, n)) - t_launch, {"exit_s": t_exit - t_launch}

    store.measure(f"cold.bare.n{n}", one, rep)


def cold_import(rep: int, store: Store) -> None:
    """launch → `import torch` done (the timestamp is taken in the child, so interpreter exit is not counted)."""
    def one() -> Tuple[float, dict]:
        t0 = time.time()
        code, out, err = P.run_proc([PY, "-c", "import torch, time, os; os.write(1, repr(time.time()).encode())"])
        t_exit = time.time()
        if code != 0:
            raise RuntimeError(f"exit {code}: {P.tail(err)}")
        return float(out.strip()) - t0, {"exit_s": t_exit - t0}

    store.measure("cold.import", one, rep)


def warm_page_cache(extra: str = "") -> str:
    """The first torch import after boot reads from disk; nobody should pay for it. Returns torch's version ("?" if unknown)."""
    modules = "torch, torch.distributed, torch.nn.parallel, cloudpickle, ddp_magic.procs.worker" + (", " + extra if extra else "")
    try:
        P.run_proc([PY, "-c", f"import {modules}"])
        _, tv, _ = P.run_proc([PY, "-c", "import torch; print(torch.__version__)"])
        return tv.strip() or "?"
    except Exception as e:  # the figures still come; the header says "?"
        log(f"warm-up import failed: {short_error(e)}")
        return "?"
