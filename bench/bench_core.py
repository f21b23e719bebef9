#!/usr/bin/env python
"""Core benchmarks of ddp_magic: cold start, restart, warm round trip, result return.

    .venv/bin/python bench/bench_core.py [--ns 1,2,4,8] [--repeats R] [--warm-repeats W]
                                         [--max-total-gib G] [--quick]

Prints Markdown tables and writes them to bench/results/core.md, with the raw
numbers in bench/results/core.json. Every figure is a median over repeats with
min–max in brackets. See bench/README.md for what each column means.

The module imports only the standard library at the top: the same file runs as
a child process (``--child ...``) for the measurements made through the Python
API and for the memcpy baseline, and jupyter_client is imported only where a
kernel is driven.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS_DIR = os.path.join(HERE, "results")
PY = sys.executable
SRC = REPO  # the directory holding the ddp_magic package under test (--src / --git-rev)
MIB = 1 << 20

# The cold-start job, the same in every launcher: init gloo, one all_reduce, the result.
COLD_CELL_SRC = "import torch.distributed as dist\nt = __import__('torch').ones(1)\ndist.all_reduce(t)\nt"
PLAIN_JOB = (
    "import os, time, torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "t = torch.ones(1)\n"
    "dist.all_reduce(t)\n"
    "os.write(1, f'RESULT {time.time()!r} {t.item()}\\n'.encode())  # one write: ranks share the pipe\n"
    "dist.destroy_process_group()\n"
)
API_COLD_CHILD = r'''
import json, sys, time
from ddp_magic.kernel.pool import Pool
n, src = int(sys.argv[1]), sys.argv[2]
out = {"torch_before": "torch" in sys.modules}
p = Pool(n)
try:
    o = p.run(src)
    out["t_result"] = time.time()
    out["torch_after"] = "torch" in sys.modules
    out["cell_s"] = o.elapsed
    out["ok"] = o.ok
    out["values"] = [repr(v) for v in o.values]
    out["failures"] = [f.headline() for f in o.failures]
    out["start_seconds"] = getattr(p, "start_seconds", None)
    out["template_info"] = getattr(p, "template_info", "")
    proc = getattr(p.launcher, "proc", None)
    out["pids"] = [x for x in p.pids if x] + ([proc.pid] if proc is not None else [])
finally:
    t = time.monotonic()
    p.stop()
    out["stop_s"] = time.monotonic() - t
print("BENCHJSON " + json.dumps(out), flush=True)
'''


# ====================================================================== small utilities
def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def short_error(e: BaseException, limit: int = 300) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Series:
    """The repeats of one measurement: values (seconds, or whatever the key says) and errors."""

    def __init__(self) -> None:
        self.values: List[float] = []
        self.errors: List[str] = []
        self.info: List[Any] = []

    def to_dict(self) -> dict:
        return {"values": self.values, "errors": self.errors, "info": self.info}

    @classmethod
    def from_dict(cls, d: dict) -> "Series":
        s = cls()
        s.values, s.errors, s.info = list(d.get("values", [])), list(d.get("errors", [])), list(d.get("info", []))
        return s


class Store:
    def __init__(self) -> None:
        self.series: Dict[str, Series] = {}
        self.notes: List[str] = []

    def get(self, key: str) -> Series:
        return self.series.setdefault(key, Series())

    def measure(self, key: str, fn: Callable[[], Any]) -> Optional[float]:
        """Run fn; a float (or (float, info)) is one sample; an exception is one error, never a crash."""
        s = self.get(key)
        try:
            got = fn()
        except Exception as e:  # a failed measurement goes in its table cell
            s.errors.append(short_error(e))
            log(f"{key}: FAILED {short_error(e, 200)}")
            return None
        if isinstance(got, tuple):
            value, info = got
            s.info.append(info)
        else:
            value = got
        s.values.append(float(value))
        log(f"{key}: {value:.4f}")
        return float(value)

    def measure_quiet(self, key: str, fn: Callable[[], Any]) -> Optional[float]:
        """measure() without a log line per sample (for the many warm round trips)."""
        s = self.get(key)
        try:
            value = float(fn())
        except Exception as e:
            s.errors.append(short_error(e))
            return None
        s.values.append(value)
        return value

    def error(self, key: str, text: str) -> None:
        self.get(key).errors.append(text)
        log(f"{key}: FAILED {text[:200]}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# ---------------------------------------------------------------- processes and orphans
def _proc_table() -> Dict[int, int]:
    """pid -> ppid for every live process, from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            table[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return table


def descendants(root: int) -> List[int]:
    children: Dict[int, List[int]] = {}
    for pid, ppid in _proc_table().items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


class OrphanWatch:
    """Pids our measurements created; each must be gone shortly after its measurement ends."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.leftover: Dict[int, str] = {}

    def expect_gone(self, pids: List[int], what: str, timeout: float = 10.0) -> None:
        pids = [p for p in pids if p and p != os.getpid()]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
            time.sleep(0.05)
        alive = [p for p in pids if pid_alive(p)]
        for p in alive:
            self.leftover[p] = f"{cmdline(p)}  (after {what})"
        if alive:
            note = f"{what}: {len(alive)} process(es) still alive {timeout:.0f}s after stop: {alive}"
            self.store.notes.append(note)
            log("WARNING " + note)


def _ppid(pid: int) -> str:
    return str(_proc_table().get(pid, "?"))


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return "?"


def pgrep_ddp_magic() -> List[Tuple[int, str]]:
    try:
        out = subprocess.run(["pgrep", "-af", "ddp_magic"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = []
    for line in out.splitlines():
        pid, _, cmd = line.partition(" ")
        if pid.isdigit() and int(pid) != os.getpid():
            rows.append((int(pid), cmd))
    return rows


def run_proc(argv: List[str], env: Optional[dict] = None, timeout: float = 300.0) -> Tuple[int, str, str]:
    """Run to completion in its own session; on timeout the whole group is killed and TimeoutError raised."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=SRC, start_new_session=True, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _killpg(proc)
        raise TimeoutError(f"{' '.join(argv[:3])}… ran past {timeout:.0f}s")
    return proc.returncode, out, err


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.communicate(timeout=10)
    except Exception as e:  # the group is killed; its pipes are only drained
        log(f"draining pid {proc.pid} after SIGKILL: {short_error(e)}")


def tail(text: str, n: int = 400) -> str:
    text = (text or "").strip()
    return text[-n:]


def child_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    env["PYTHONPATH"] = os.pathsep.join([SRC] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


# ====================================================================== a Jupyter kernel
class KernelSession:
    """A fresh IPython kernel driven through jupyter_client; ``run`` times execute → idle."""

    def __init__(self, startup_timeout: float = 120.0) -> None:
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(startup_timeout=startup_timeout, kernel_name="python3", env=child_env(), cwd=SRC)
        self.pid = self.km.provisioner.process.pid  # type: ignore[union-attr]

    def run(self, code: str, timeout: float = 300.0) -> dict:
        """Execute; elapsed = execute request → idle; value = the execute_result's text (displays, such as
        the status view, are only in results); events = (arrival time.time(), text) of every output message."""
        ex: Dict[str, Any] = {"stdout": "", "stderr": "", "results": [], "value": None, "error": None, "events": []}
        displays: Dict[str, int] = {}  # display_id → index in results: update_display_data replaces it (ipyparallel streams so)
        t0 = time.perf_counter()
        msg_id = self.kc.execute(code)
        while True:
            left = timeout - (time.perf_counter() - t0)
            if left <= 0:
                raise TimeoutError(f"cell ran past {timeout:.0f}s: {code[:60]!r}; stdout: {tail(ex['stdout'], 200)!r}; stderr: {tail(ex['stderr'], 200)!r}")
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 5.0))
            except queue.Empty:
                continue
            now = time.time()
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                ex[content["name"]] = ex.get(content["name"], "") + content["text"]
                ex["events"].append((now, content["text"], "stream"))
            elif kind in ("execute_result", "display_data", "update_display_data"):
                text = content["data"].get("text/plain", "")
                did = (content.get("transient") or {}).get("display_id")
                if kind == "update_display_data":
                    if did in displays:
                        ex["results"][displays[did]] = text
                else:
                    if did:
                        displays[did] = len(ex["results"])
                    ex["results"].append(text)
                    if kind == "execute_result":
                        ex["value"] = text
                ex["events"].append((now, text, "display"))
            elif kind == "error":
                ex["error"] = f"{content['ename']}: {content['evalue']}"
            elif kind == "status" and content["execution_state"] == "idle":
                break
        ex["elapsed"] = time.perf_counter() - t0
        return ex

    def ok(self, code: str, timeout: float = 300.0) -> dict:
        ex = self.run(code, timeout)
        if ex["error"]:
            raise RuntimeError(f"{ex['error']} | stderr: {tail(ex['stderr'], 300)}")
        return ex

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)


def _stop_kernel(k: Optional[KernelSession], watch: OrphanWatch, what: str) -> None:
    if k is None:
        return
    pids = [k.pid] + descendants(k.pid)
    try:
        k.run("%ddp stop", timeout=60)
    except Exception as e:
        log(f"{what}: %ddp stop failed: {short_error(e)}")
    try:
        k.shutdown()
    except Exception as e:
        log(f"{what}: kernel shutdown failed: {short_error(e)}")
    watch.expect_gone(pids, what)


# ====================================================================== 1. cold start
def cold_kernel(n: int, store: Store, watch: OrphanWatch) -> None:
    key = f"cold.kernel.n{n}"
    k = None
    try:
        k = KernelSession()
        k.ok("%load_ext ddp_magic")

        def one() -> Tuple[float, dict]:
            ex = k.ok(f"%%ddp -n {n}\n{COLD_CELL_SRC}", timeout=300)
            text = ex["results"][-1] if ex["results"] else ""
            if text.count(f"tensor([{n}.])") != n:
                raise RuntimeError(f"unexpected result {text[:200]!r}; stderr: {tail(ex['stderr'], 200)}")
            return ex["elapsed"], {"stderr": tail(ex["stderr"], 300)}

        store.measure(key, one)
    except Exception as e:
        store.error(key, short_error(e))
    finally:
        _stop_kernel(k, watch, f"cold kernel n={n}")


def cold_api(n: int, store: Store, watch: OrphanWatch, as_float: bool = False) -> None:
    src = COLD_CELL_SRC + (".item()" if as_float else "")
    expected = [repr(float(n))] * n if as_float else [f"tensor([{n}.])"] * n

    def one() -> Tuple[float, dict]:
        t_launch = time.time()
        code, out, err = run_proc([PY, "-c", API_COLD_CHILD, str(n), src], env=child_env())
        got = [json.loads(line[len("BENCHJSON "):]) for line in out.splitlines() if line.startswith("BENCHJSON ")]
        if code != 0 or not got:
            raise RuntimeError(f"exit {code}: {tail(err, 300)}")
        r = got[-1]
        watch.expect_gone(r.get("pids", []), f"cold API n={n}")
        if not r["ok"] or r["values"] != expected:
            raise RuntimeError(f"values {r['values']} failures {r['failures']}")
        return r["t_result"] - t_launch, {k: r.get(k) for k in ("start_seconds", "template_info", "stop_s", "cell_s", "torch_before", "torch_after")}

    store.measure(f"cold.{'apifloat' if as_float else 'api'}.n{n}", one)


def _parse_results(out: str, n: int) -> List[float]:
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


def cold_torchrun(n: int, store: Store, job_path: str) -> None:
    torchrun = os.path.join(os.path.dirname(PY), "torchrun")

    def one() -> Tuple[float, dict]:
        launcher = [torchrun] if os.path.exists(torchrun) else [PY, "-m", "torch.distributed.run"]
        argv = launcher + ["--standalone", f"--nproc-per-node={n}", job_path]
        t_launch = time.time()
        code, out, err = run_proc(argv, env=child_env())
        t_exit = time.time()
        if code != 0:
            raise RuntimeError(f"exit {code}: {tail(err, 300)}")
        try:
            times = _parse_results(out, n)
        except RuntimeError as e:
            raise RuntimeError(f"{e}; stdout: {tail(out, 200)!r}; stderr: {tail(err, 300)!r}") from None
        return max(times) - t_launch, {"exit_s": t_exit - t_launch}

    store.measure(f"cold.torchrun.n{n}", one)


def write_report(out: str, md: str, payload: dict) -> None:
    """Print the Markdown table and keep it, with every raw sample, as out.md and out.json."""
    print(md)
    with open(out + ".md", "w") as f:
        f.write(md + "\n")
    with open(out + ".json", "w") as f:
        json.dump(payload, f, indent=1)
    log(f"wrote {out}.md and {out}.json")


def launch_bare(n: int, src: str, cwd: Optional[str] = None) -> Tuple[float, float, str]:
    """The floor: n `python -c src` ranks started together with the torch env set by hand.

    Returns (launch time, exit time, every rank's stdout); raises with a rank's stderr if one fails.
    """
    port = free_port()
    procs = []
    t_launch = time.time()
    try:
        for r in range(n):
            env = child_env()
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n))
            procs.append(subprocess.Popen([PY, "-c", src], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True, text=True))
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            if p.returncode != 0:
                raise RuntimeError(f"rank exit {p.returncode}: {tail(err, 300)}")
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                _killpg(p)
    return t_launch, time.time(), "\n".join(outs)


def cold_bare(n: int, store: Store) -> None:
    def one() -> Tuple[float, dict]:
        t_launch, t_exit, out = launch_bare(n, PLAIN_JOB, cwd=SRC)
        return max(_parse_results(out, n)) - t_launch, {"exit_s": t_exit - t_launch}

    store.measure(f"cold.bare.n{n}", one)


def cold_import(store: Store) -> None:
    """launch → `import torch` done (the timestamp is taken in the child, so interpreter exit is not counted)."""
    def one() -> Tuple[float, dict]:
        t0 = time.time()
        code, out, err = run_proc([PY, "-c", "import torch, time, os; os.write(1, repr(time.time()).encode())"], env=child_env())
        t_exit = time.time()
        if code != 0:
            raise RuntimeError(f"exit {code}: {tail(err)}")
        return float(out.strip()) - t0, {"exit_s": t_exit - t0}

    store.measure("cold.import", one)


# ====================================================================== 2-4. a live pool in the kernel
def make_tensor(elems: int, untouched: bool) -> str:
    """The untimed cell that makes the tensor a rank returns.

    A fresh torch.empty is not in memory yet: its pages are faulted in by whoever reads them first, and
    that was the first timed return (5.9 s instead of 1.6 s for 8 x 256 MiB here). fill_ pays it up front.
    """
    return f"t = torch.empty({elems})" + ("" if untouched else ".fill_(1.0)")


def sizes_for(n: int, sizes_mib: List[int], max_total_gib: float) -> List[Tuple[int, bool]]:
    return [(s, n * s * MIB <= max_total_gib * (1 << 30)) for s in sizes_mib]


KERNEL_SETUP = "import torch, torch.distributed as dist"


def _kernel_small_tensor(k: KernelSession, n: int, store: Store) -> None:
    """The first tensor result makes the kernel import torch (it had no need before): first and second timed apart."""
    for which in ("first", "second"):
        def small_tensor() -> float:
            ex = k.ok("%%ddp\ntorch.ones(1)", timeout=120)
            if not ex["results"] or ex["results"][-1].count("tensor([1.])") != n:
                raise RuntimeError(f"unexpected result {ex['results'][-1:]!r}")
            return ex["elapsed"]

        store.measure(f"tensor1.kernel.{which}.n{n}", small_tensor)


def _kernel_restart(k: KernelSession, n: int, args: argparse.Namespace, store: Store) -> None:
    """2. `%ddp restart` until the 'ready in' line."""
    for _ in range(args.restart_repeats):
        def restart() -> Tuple[float, str]:
            ex = k.ok("%ddp restart", timeout=300)
            if "ready in" not in ex["stdout"]:
                raise RuntimeError(f"no 'ready' line: {tail(ex['stdout'])} {tail(ex['stderr'])}")
            return ex["elapsed"], ex["stdout"].strip()

        store.measure(f"restart.kernel.n{n}", restart)


def _kernel_warm(k: KernelSession, n: int, args: argparse.Namespace, store: Store) -> None:
    """3. Warm round trips, interleaved so drift hits every column alike.

    "ddp"/"allreduce" as a user gets them (with the status view), "nowidget" with --no-widget."""
    cells = {
        "plain": ("1", lambda ex: ex["value"] == "1"),
        "ddp": ("%%ddp\n1", lambda ex: (ex["value"] or "").count("] 1") == n),
        "nowidget": ("%%ddp --no-widget\n1", lambda ex: (ex["value"] or "").count("] 1") == n and len(ex["results"]) == 1),
        "allreduce": ("%%ddp\nx = torch.ones(1)\ndist.all_reduce(x)", lambda ex: ex["value"] is None),
    }
    for _ in range(3):  # warm-up
        for code, _check in cells.values():
            k.ok(code)
    fails = {name: 0 for name in cells}
    for i in range(args.warm_repeats):
        for name, (code, check) in cells.items():
            def one(code: str = code, check: Callable = check) -> float:
                ex = k.ok(code, timeout=60)
                if not check(ex):
                    raise RuntimeError(f"unexpected output: value={ex['value']!r} results={ex['results'][-2:]!r} stderr={tail(ex['stderr'], 200)!r}")
                return ex["elapsed"]

            if store.measure_quiet(f"warm.kernel.{name}.n{n}", one) is None:
                fails[name] += 1
        if i % 25 == 24:
            k.ok("%reset -f out")
    medians = {name: statistics.median(store.get(f"warm.kernel.{name}.n{n}").values or [float("nan")]) for name in cells}
    log(f"warm kernel n={n}: " + ", ".join(f"{name} median {1e3 * m:.2f} ms" for name, m in medians.items()))


def _kernel_results(k: KernelSession, n: int, args: argparse.Namespace, store: Store) -> None:
    """4. Result return: every rank's tensor of each size into the notebook."""
    for size, allowed in sizes_for(n, args.sizes, args.max_total_gib):
        key = f"result.kernel.n{n}.s{size}"
        if not allowed:
            continue
        elems = size * MIB // 4
        try:
            k.ok(f"%%ddp\n{make_tensor(elems, args.untouched)}", timeout=300)
        except Exception as e:
            store.error(key, short_error(e))
            continue
        for _ in range(args.result_repeats):
            def ret() -> float:
                ex = k.ok("%%ddp\nt", timeout=600)
                text = ex["results"][-1] if ex["results"] else ""
                if not text.startswith("RankResults(") or text.count("tensor(") != n:
                    raise RuntimeError(f"unexpected result {text[:200]!r}")
                return ex["elapsed"]

            store.measure(key, ret)
            k.ok("%reset -f out")
        k.ok("%%ddp\ndel t")


def live_kernel(n: int, args: argparse.Namespace, store: Store, watch: OrphanWatch) -> None:
    """Sections 2-4 through a real kernel: small tensor, restart, warm cells, result return."""
    k = None
    try:
        k = KernelSession()
        k.ok("%load_ext ddp_magic")
        where = k.ok("import ddp_magic as _m; _m.__file__")["results"]
        if not where or SRC + os.sep not in where[-1]:
            store.notes.append(f"WARNING: the kernel imported ddp_magic from {where}, not from {SRC}")
        k.ok("del _m")
        k.ok(f"%%ddp -n {n}\n{KERNEL_SETUP}", timeout=300)
        _kernel_small_tensor(k, n, store)
        _kernel_restart(k, n, args, store)
        k.ok(f"%%ddp\n{KERNEL_SETUP}", timeout=300)
        _kernel_warm(k, n, args, store)
        _kernel_results(k, n, args, store)
    except Exception as e:
        store.error(f"live.kernel.n{n}", short_error(e))
        log(traceback.format_exc())
    finally:
        _stop_kernel(k, watch, f"live kernel n={n}")


# ====================================================================== 2-4. a live pool via the API (child process)
def _api_run_ok(p: Any, src: str) -> Any:
    out = p.run(src)
    if not out.ok:
        raise RuntimeError("; ".join(f.headline() for f in out.failures))
    return out


def _api_small_tensor_and_restart(p: Any, n: int, restart_repeats: int, store: Store, pids: List[int]) -> None:
    """The first tensor result (the kernel imports torch), then `Pool.restart` timed."""
    def restart() -> float:
        t0 = time.perf_counter()
        p.restart()
        dt = time.perf_counter() - t0
        pids.extend(x for x in p.pids if x)
        return dt

    for which in ("first", "second"):
        def small_tensor() -> float:
            t0 = time.perf_counter()
            out = _api_run_ok(p, "torch.ones(1)")
            dt = time.perf_counter() - t0
            if [float(v) for v in out.values] != [1.0] * n:
                raise RuntimeError(f"values {out.values!r}")
            return dt

        store.measure_quiet(f"tensor1.api.{which}.n{n}", small_tensor)
    for _ in range(restart_repeats):
        store.measure_quiet(f"restart.api.n{n}", restart)


def _api_warm(p: Any, n: int, warm_repeats: int, store: Store) -> None:
    """Warm `Pool.run` round trips, the two cells interleaved."""
    cells = {"ddp": "1", "allreduce": "x = torch.ones(1)\ndist.all_reduce(x)"}
    for _ in range(3):
        for src in cells.values():
            _api_run_ok(p, src)
    for _ in range(warm_repeats):
        for name, src in cells.items():
            def one(src: str = src, name: str = name) -> float:
                t0 = time.perf_counter()
                out = _api_run_ok(p, src)
                dt = time.perf_counter() - t0
                if out.values != ([1] * n if name == "ddp" else [None] * n):
                    raise RuntimeError(f"values {out.values!r}")
                return dt

            store.measure_quiet(f"warm.api.{name}.n{n}", one)


def _api_results(p: Any, n: int, result_repeats: int, sizes: List[int], max_total_gib: float, untouched: bool, store: Store) -> None:
    """Result return through `Pool.run`: every rank's tensor of each size."""
    for size, allowed in sizes_for(n, sizes, max_total_gib):
        if not allowed:
            continue
        key = f"result.api.n{n}.s{size}"
        elems = size * MIB // 4
        try:
            _api_run_ok(p, make_tensor(elems, untouched))
        except Exception as e:
            store.error(key, short_error(e))
            continue
        for _ in range(result_repeats):
            def ret(elems: int = elems) -> float:
                t0 = time.perf_counter()
                out = _api_run_ok(p, "t")
                dt = time.perf_counter() - t0
                if len(out.values) != n or any(getattr(v, "numel", lambda: -1)() != elems for v in out.values):
                    raise RuntimeError(f"unexpected values {[type(v).__name__ for v in out.values]}")
                del out
                return dt

            store.measure_quiet(key, ret)
        _api_run_ok(p, "del t")


def child_api_live(n: int, result_repeats: int, restart_repeats: int, warm_repeats: int, sizes: List[int], max_total_gib: float, untouched: bool) -> None:
    """Sections 2-4 through `Pool` in this (child) process; prints the series as one BENCHJSON line."""
    sys.path.insert(0, SRC)
    from ddp_magic.kernel.pool import Pool

    store = Store()
    pids: List[int] = []
    p = Pool(n)
    try:
        _api_run_ok(p, KERNEL_SETUP)
        proc = getattr(p.launcher, "proc", None)
        if proc is not None:
            pids.append(proc.pid)
        _api_small_tensor_and_restart(p, n, restart_repeats, store, pids)
        _api_run_ok(p, KERNEL_SETUP)
        _api_warm(p, n, warm_repeats, store)
        _api_results(p, n, result_repeats, sizes, max_total_gib, untouched, store)
        pids.extend(x for x in p.pids if x)
    except Exception as e:
        store.error(f"live.api.n{n}", short_error(e))
    finally:
        p.stop()
    print("BENCHJSON " + json.dumps({"series": {k: s.to_dict() for k, s in store.series.items()}, "pids": pids}), flush=True)


def live_api(n: int, args: argparse.Namespace, store: Store, watch: OrphanWatch) -> None:
    argv = [PY, os.path.abspath(__file__), "--child", "api-live", "--n", str(n), "--result-repeats", str(args.result_repeats),
            "--restart-repeats", str(args.restart_repeats), "--warm-repeats", str(args.warm_repeats), "--sizes", ",".join(map(str, args.sizes)),
            "--max-total-gib", str(args.max_total_gib), "--src", SRC] + (["--untouched"] if args.untouched else [])
    try:
        code, out, err = run_proc(argv, env=child_env(), timeout=900)
        got = [json.loads(line[len("BENCHJSON "):]) for line in out.splitlines() if line.startswith("BENCHJSON ")]
        if not got:
            raise RuntimeError(f"exit {code}: {tail(err, 300)}")
        for key, d in got[-1]["series"].items():
            s = store.get(key)
            other = Series.from_dict(d)
            s.values += other.values
            s.errors += other.errors
            s.info += other.info
            if other.values:
                log(f"{key}: median {statistics.median(other.values):.4f} over {len(other.values)}")
            for e in other.errors[:1]:
                log(f"{key}: FAILED {e[:200]}")
        watch.expect_gone(got[-1]["pids"], f"API pool n={n}")
    except Exception as e:
        store.error(f"live.api.n{n}", short_error(e))


# ====================================================================== memcpy baseline (child process)
def child_memcpy(combos: List[Tuple[int, int]], repeats: int, untouched: bool) -> None:
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


def memcpy_baseline(args: argparse.Namespace, store: Store) -> None:
    combos = [(n, s) for n in args.ns for s, ok in sizes_for(n, args.sizes, args.max_total_gib) if ok]
    if not combos:
        return
    argv = [PY, os.path.abspath(__file__), "--child", "memcpy", "--combos", ";".join(f"{n},{s}" for n, s in combos),
            "--result-repeats", str(args.result_repeats)] + (["--untouched"] if args.untouched else [])
    try:
        code, out, err = run_proc(argv, env=child_env(), timeout=600)
        got = [json.loads(line[len("BENCHJSON "):]) for line in out.splitlines() if line.startswith("BENCHJSON ")]
        if not got:
            raise RuntimeError(f"exit {code}: {tail(err, 300)}")
        for combo, times in got[-1]["memcpy"].items():
            n, s = combo.split(",")
            store.get(f"result.memcpy.n{n}.s{s}").values += times
        store.notes.append(f"memcpy baseline ran with torch.get_num_threads() = {got[-1]['threads']}")
    except Exception as e:
        for n, s in combos:
            store.error(f"result.memcpy.n{n}.s{s}", short_error(e))


# ====================================================================== the tables
def _cell_text(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ").strip()


def fmt(s: Optional[Series], scale: float = 1.0, digits: int = 2, invert: Optional[float] = None) -> str:
    """median (min–max) of s.values*scale, or of invert/value (a rate); errors shown in the cell."""
    if s is None or (not s.values and not s.errors):
        return "—"
    if not s.values:
        return _cell_text(f"ERROR: {s.errors[0][:160]}")
    vals = [invert / v if invert is not None else v * scale for v in s.values]
    med, lo, hi = statistics.median(vals), min(vals), max(vals)
    text = f"{med:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})" if len(vals) > 1 else f"{med:.{digits}f}"
    if s.errors:
        text += f" [{len(s.errors)} failed: {s.errors[0][:80]}]"
    return _cell_text(text)


def med(s: Optional[Series]) -> Optional[float]:
    return statistics.median(s.values) if s is not None and s.values else None


def ratio(a: Optional[float], b: Optional[float], digits: int = 2) -> str:
    return f"{a / b:.{digits}f}×" if a is not None and b else "—"


def _render_header(args: argparse.Namespace, meta: dict) -> List[str]:
    """The title and the run's circumstances (load, repeats, source)."""
    out: List[str] = []
    out.append("# ddp_magic core benchmark\n")
    out.append(
        f"{meta['date']} · {meta['cpus']} CPU cores · {meta['mem_gib']:.0f} GiB RAM · Python {meta['python']} · torch {meta['torch']} · "
        f"gloo on CPU · repeats: cold {args.repeats}, restart {args.restart_repeats}, warm {args.warm_repeats}, result {args.result_repeats} · "
        f"total bench time {meta['bench_s']:.0f} s · load average {meta['load_start']:.2f} at start, {meta['load_end']:.2f} at end "
        f"(other work on the machine skews the figures)\n"
    )
    out.append(f"Benchmarked: {args.source_desc}.\n")
    out.append("Every figure: median (min–max) over the repeats. Columns are explained in bench/README.md.\n")
    return out


def _render_cold(S: Callable[[str], Optional[Series]], args: argparse.Namespace) -> List[str]:
    """Section 1: cold start to first result."""
    out: List[str] = []
    out.append("## 1. Cold start to first result (s)\n")
    out.append("From nothing running to the all_reduced value of `torch.ones(1)` in hand. "
               "`%%ddp` in kernel: fresh kernel with `%load_ext ddp_magic` done, execute → idle. "
               "Pool API: `python -c` launch → `Pool(n).run(src)` returned. torchrun / bare: launch → the last rank printed its result.\n")
    imp = S("cold.import")
    out.append("| n | %%ddp in kernel | Pool API (fresh process) | Pool API, cell ends `t.item()` | torchrun --standalone | N bare python (init+all_reduce) "
               "| 1 bare `import torch` | kernel / import | API / import | torchrun / import |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for n in args.ns:
        k, a, af, t, b = (S(f"cold.{m}.n{n}") for m in ("kernel", "api", "apifloat", "torchrun", "bare"))
        out.append(f"| {n} | {fmt(k)} | {fmt(a)} | {fmt(af)} | {fmt(t)} | {fmt(b)} | {fmt(imp)} "
                   f"| {ratio(med(k), med(imp))} | {ratio(med(a), med(imp))} | {ratio(med(t), med(imp))} |")
    out.append("")
    return out


def _render_live(S: Callable[[str], Optional[Series]], args: argparse.Namespace) -> List[str]:
    """Sections 2, 3 and 3b: restart, warm round trips, the first tensor result."""
    out: List[str] = []
    out.append("## 2. Restart of a live pool (s)\n")
    out.append("| n | `%ddp restart` in kernel (execute → idle) | `Pool.restart()` via API |")
    out.append("|---|---|---|")
    for n in args.ns:
        out.append(f"| {n} | {fmt(S(f'restart.kernel.n{n}'), digits=3)} | {fmt(S(f'restart.api.n{n}'), digits=3)} |")
    out.append("")

    out.append("## 3. Warm round trip on a live pool (ms)\n")
    out.append("Kernel: execute request → idle on the client. API: `Pool.run(src)` call → return. "
               "Overhead = median(ddp) − median(plain cell `1`) in the same kernel.\n")
    out.append("`%%ddp` cells show the status view (the default; a cell this quick gets only its summary line, no ipywidget); "
               "the `--no-widget` column is the same cell without it.\n")
    out.append("| n | plain cell `1` | `%%ddp` `1` | overhead | `%%ddp --no-widget` `1` | overhead | `%%ddp` one all_reduce | overhead "
               "| API `run('1')` | API one all_reduce |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for n in args.ns:
        pl, dd, nw, ar = (S(f"warm.kernel.{c}.n{n}") for c in ("plain", "ddp", "nowidget", "allreduce"))

        def over(s: Any, pl: Any = pl) -> str:
            return f"{1e3 * (med(s) - med(pl)):.2f}" if med(s) is not None and med(pl) is not None else "—"

        out.append(f"| {n} | {fmt(pl, 1e3)} | {fmt(dd, 1e3)} | {over(dd)} | {fmt(nw, 1e3)} | {over(nw)} | {fmt(ar, 1e3)} | {over(ar)} | "
                   f"{fmt(S(f'warm.api.ddp.n{n}'), 1e3)} | {fmt(S(f'warm.api.allreduce.n{n}'), 1e3)} |")
    out.append("")

    out.append("### 3b. A one-element tensor result, first and second time on a live pool (s)\n")
    out.append("The kernel (or API process) has not imported torch before its first tensor result; the first `%%ddp` cell `torch.ones(1)` pays that import.\n")
    out.append("| n | kernel: first | kernel: second | API: first | API: second |")
    out.append("|---|---|---|---|---|")
    for n in args.ns:
        out.append(f"| {n} | " + " | ".join(fmt(S(f"tensor1.{w}.{which}.n{n}"), digits=3) for w in ("kernel", "api") for which in ("first", "second")) + " |")
    out.append("")
    return out


def _render_results(S: Callable[[str], Optional[Series]], args: argparse.Namespace) -> List[str]:
    """Section 4: result return against memcpy."""
    out: List[str] = []
    out.append("## 4. Result return: every rank returns a float32 tensor (`%%ddp` cell `t`)\n")
    out.append("MB/s = n × size / seconds (MB = 10^6 bytes). "
               "memcpy = `torch.empty_like(x).copy_(x)` of the same n × size bytes in one process (the physical limit). "
               + ("Tensors: a bare `torch.empty` (--untouched), so the first timed return faults its pages in.\n" if args.untouched else
                  "Tensors: `torch.empty(N)` then `fill_(1.0)` in the untimed cell, so the timed cell does not fault fresh pages in (see bench/README.md).\n"))
    out.append("| n | size per rank | total | kernel s | kernel MB/s | API s | API MB/s | memcpy s | memcpy MB/s | kernel / memcpy time |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for n in args.ns:
        for size, allowed in sizes_for(n, args.sizes, args.max_total_gib):
            total_mib = n * size
            tot = f"{total_mib / 1024:.2f} GiB" if total_mib >= 1024 else f"{total_mib} MiB"
            if not allowed:
                out.append(f"| {n} | {size} MiB | {tot} | skipped: total > --max-total-gib {args.max_total_gib:g} | | | | | | |")
                continue
            nbytes = n * size * MIB
            k, a, m = (S(f"result.{w}.n{n}.s{size}") for w in ("kernel", "api", "memcpy"))
            out.append(
                f"| {n} | {size} MiB | {tot} | {fmt(k, digits=3)} | {fmt(k, digits=0, invert=nbytes / 1e6)} "
                f"| {fmt(a, digits=3)} | {fmt(a, digits=0, invert=nbytes / 1e6)} "
                f"| {fmt(m, digits=3)} | {fmt(m, digits=0, invert=nbytes / 1e6)} | {ratio(med(k), med(m), 1)} |"
            )
    out.append("")
    return out


def _render_notes(store: Store, args: argparse.Namespace) -> List[str]:
    """The per-phase breakdowns, errors of the live pools and the store's notes."""
    out: List[str] = []
    S = store.series.get
    imp = S("cold.import")
    extra = []
    for n in args.ns:
        live_errs = [e for w in ("kernel", "api") for e in (S(f"live.{w}.n{n}").errors if S(f"live.{w}.n{n}") else [])]
        extra += [f"live pool n={n}: {e}" for e in live_errs]
    for n in args.ns:
        info = [i for i in (S(f"cold.api.n{n}").info if S(f"cold.api.n{n}") else []) if isinstance(i, dict)]
        if info:
            def m(key: str, info: List[dict] = info) -> float:
                vals = [i[key] for i in info if isinstance(i.get(key), (int, float))]
                return statistics.median(vals) if vals else float("nan")

            imports = []
            for i in info:
                try:
                    imports.append(float(str(i.get("template_info", "")).rsplit(" in ", 1)[1].rstrip("s")))
                except (IndexError, ValueError):
                    pass
            imp_txt = f"template import {statistics.median(imports):.2f}s" if imports else "template import ?"
            extra.append(
                f"Pool API cold, n={n} (medians): {imp_txt}; Pool.start {m('start_seconds'):.2f}s, "
                f"then the cell until run() returned {m('cell_s'):.2f}s, Pool.stop {m('stop_s'):.2f}s; torch imported in the calling process by the result: "
                f"{sum(1 for i in info if i.get('torch_after') and not i.get('torch_before'))}/{len(info)}"
            )
    for n in args.ns:
        tr = S(f"cold.torchrun.n{n}")
        ex = [i["exit_s"] for i in (tr.info if tr else []) if isinstance(i, dict) and "exit_s" in i]
        if ex:
            extra.append(f"torchrun n={n}: launch → process exit median {statistics.median(ex):.2f}s")
    imp_exit = [i["exit_s"] for i in (imp.info if imp else []) if isinstance(i, dict) and "exit_s" in i]
    if imp_exit:
        extra.append(f"bare `import torch`: launch → process exit median {statistics.median(imp_exit):.2f}s (the table counts launch → import done)")
    extra += store.notes
    if extra:
        out.append("## Notes\n")
        out += [f"- {_cell_text(x)}" for x in extra]
        out.append("")
    return out


def render(store: Store, args: argparse.Namespace, meta: dict) -> str:
    """The markdown report: header, sections 1-4, notes."""
    S = store.series.get
    out = _render_header(args, meta) + _render_cold(S, args) + _render_live(S, args) + _render_results(S, args) + _render_notes(store, args)
    return "\n".join(out)


# ====================================================================== main
def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", default=None, help="rank counts, comma-separated (default 1,2,4,8; --quick: 1,2)")
    p.add_argument("--repeats", type=int, default=None, help="repeats of each cold start (default 3; --quick: 2)")
    p.add_argument("--result-repeats", type=int, default=None, help="repeats of each result return and memcpy (default 5; --quick: 2)")
    p.add_argument("--restart-repeats", type=int, default=None, help="repeats of the restart measurement (default 10; --quick: 3)")
    p.add_argument("--warm-repeats", type=int, default=None, help="repeats of each warm round trip (default 50; --quick: 15)")
    p.add_argument("--sizes", default="64,256", help="MiB per rank returned in section 4 (default 64,256)")
    p.add_argument("--max-total-gib", type=float, default=3.0, help="skip result sizes whose n × size exceeds this (default 3)")
    p.add_argument("--untouched", action="store_true", help="section 4: return a bare torch.empty (pages not yet in memory) instead of a filled one")
    p.add_argument("--quick", action="store_true", help="ns 1,2 and fewer repeats (under 2 minutes)")
    p.add_argument("--skip", default="", help="sections to skip, comma-separated: cold,live,memcpy")
    p.add_argument("--out", default=os.path.join(RESULTS_DIR, "core"), help="output path without extension (default bench/results/core)")
    p.add_argument("--src", default=REPO, help="directory holding the ddp_magic package to benchmark (default: this checkout)")
    p.add_argument("--git-rev", help="benchmark ddp_magic as committed at this revision (git archive into a temp dir), e.g. HEAD; "
                   "useful while the working tree is being edited")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--combos", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.ns = [int(x) for x in (a.ns or ("1,2" if a.quick else "1,2,4,8")).split(",") if x.strip()]
    a.repeats = a.repeats if a.repeats is not None else (2 if a.quick else 3)
    a.result_repeats = a.result_repeats if a.result_repeats is not None else (2 if a.quick else 5)
    a.restart_repeats = a.restart_repeats if a.restart_repeats is not None else (3 if a.quick else 10)
    a.warm_repeats = a.warm_repeats if a.warm_repeats is not None else (15 if a.quick else 50)
    a.sizes = [int(x) for x in str(a.sizes).split(",") if x.strip()]
    a.skip = {x.strip() for x in a.skip.split(",") if x.strip()}
    return a


def export_rev(rev: str) -> Tuple[str, str]:
    """ddp_magic as committed at rev, unpacked into a temp dir (read-only git: the checkout is untouched)."""
    sha = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", rev + "^{commit}"], capture_output=True, text=True, check=True).stdout.strip()
    dest = tempfile.mkdtemp(prefix="ddp_bench_src_")
    archive = subprocess.run(["git", "-C", REPO, "archive", "--format=tar", sha, "ddp_magic"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return dest, sha


def _run_child(args: argparse.Namespace) -> int:
    """The --child modes: a live pool via the API, or the memcpy baseline, each in its own process."""
    if args.child == "api-live":
        child_api_live(args.n, args.result_repeats, args.restart_repeats, args.warm_repeats, args.sizes, args.max_total_gib, args.untouched)
    elif args.child == "memcpy":
        child_memcpy([tuple(int(v) for v in c.split(",")) for c in args.combos.split(";")], args.result_repeats, args.untouched)  # type: ignore[misc]
    return 0


def _prepare(store: Store) -> str:
    """Warm the page cache, check where ddp_magic comes from; returns torch's version."""
    # Page cache: the first torch import after boot reads from disk; nobody should pay for it.
    try:
        run_proc([PY, "-c", "import torch, torch.distributed, torch.nn.parallel, cloudpickle, ddp_magic.procs.worker"], env=child_env())
    except Exception as e:
        log(f"warm-up import failed: {short_error(e)}")
    try:
        _, where, _ = run_proc([PY, "-c", "import ddp_magic; print(ddp_magic.__file__)"], env=child_env())
        where = where.strip()
        if not where.startswith(SRC + os.sep):
            store.notes.append(f"WARNING: ddp_magic was imported from {where}, not from {SRC}")
    except Exception as e:
        log(f"could not locate ddp_magic: {short_error(e)}")
    torch_version = "?"
    try:
        _, tv, _ = run_proc([PY, "-c", "import torch; print(torch.__version__)"], env=child_env())
        torch_version = tv.strip()
    except Exception as e:
        log(f"torch version unknown: {short_error(e)}")
    return torch_version


def _run_sections(args: argparse.Namespace, store: Store, watch: OrphanWatch, job_path: str) -> None:
    """Sections 1-4 and the memcpy baseline, in the order and interleaving that the tables assume."""
    if "cold" not in args.skip:
        # Interleaved: each repeat visits every n and every launcher, so drift hits all alike.
        for rep in range(args.repeats):
            log(f"cold start, repeat {rep + 1}/{args.repeats}")
            cold_import(store)
            for n in args.ns:
                cold_kernel(n, store, watch)
                cold_api(n, store, watch)
                cold_api(n, store, watch, as_float=True)
                cold_torchrun(n, store, job_path)
                cold_bare(n, store)
    if "live" not in args.skip:
        for n in args.ns:
            log(f"live pool n={n}: kernel")
            live_kernel(n, args, store, watch)
            log(f"live pool n={n}: API")
            live_api(n, args, store, watch)
    if "memcpy" not in args.skip:
        log("memcpy baseline")
        memcpy_baseline(args, store)


def _leftovers(before: set, watch: OrphanWatch, store: Store) -> Tuple[List[Tuple[int, str]], bool]:
    """Processes this run left behind (noted in the report); returns `pgrep`'s list and whether any are new."""
    time.sleep(0.5)
    after = pgrep_ddp_magic()
    new = [(pid, cmd) for pid, cmd in after if pid not in before]
    ours = {pid for pid in watch.leftover if pid_alive(pid)}
    if ours:
        store.notes.append(f"WARNING: processes started by this benchmark are still alive: {sorted(ours)}")
    if new:
        store.notes.append(
            "WARNING: `pgrep -f ddp_magic` shows processes that were not there when the benchmark started "
            "(not among the processes this benchmark started and checked; they may belong to someone else's concurrent run): "
            + "; ".join(f"{pid} (ppid {_ppid(pid)}, cwd {_cwd(pid)}) {cmd[:80]}" for pid, cmd in new)
        )
    return after, bool(ours or new)


def main() -> int:
    global SRC
    args = parse_args()
    exported = None
    if args.git_rev and not args.child:
        exported, sha = export_rev(args.git_rev)
        args.src = exported
        args.source_desc = f"ddp_magic at commit {sha[:10]} ({args.git_rev}), exported with git archive"
    else:
        args.source_desc = f"ddp_magic from {os.path.abspath(args.src)}" + (" (working tree)" if os.path.abspath(args.src) == REPO else "")
    SRC = os.path.abspath(args.src)
    if args.child in ("api-live", "memcpy"):
        return _run_child(args)

    t_start = time.monotonic()
    load_start = os.getloadavg()[0]
    store = Store()
    watch = OrphanWatch(store)
    before = {pid for pid, _ in pgrep_ddp_magic()}
    os.makedirs(RESULTS_DIR, exist_ok=True)
    log(f"ns={args.ns} repeats={args.repeats} warm_repeats={args.warm_repeats} sizes={args.sizes} MiB max_total={args.max_total_gib} GiB")
    torch_version = _prepare(store)
    tmpdir = tempfile.mkdtemp(prefix="ddp_bench_")
    job_path = os.path.join(tmpdir, "job.py")
    with open(job_path, "w") as f:
        f.write(PLAIN_JOB)
    try:
        _run_sections(args, store, watch, job_path)
    except KeyboardInterrupt:
        store.notes.append("interrupted by the user; the tables are partial")
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
        if exported:
            shutil.rmtree(exported, ignore_errors=True)
    after, left = _leftovers(before, watch, store)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpus": cpu_count(),
        "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30),
        "python": platform.python_version(),
        "torch": torch_version,
        "bench_s": time.monotonic() - t_start,
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "args": {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()},
    }
    md = render(store, args, meta)
    write_report(args.out, md, {"meta": meta, "series": {k: s.to_dict() for k, s in store.series.items()}, "notes": store.notes})
    if left:
        print("\nWARNING: processes left behind (`pgrep -af ddp_magic`):", file=sys.stderr)
        for pid, cmd in after:
            print(f"  {pid} {cmd}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
