"""Real %%ddp -n 2 cells in a real Jupyter kernel with real workers."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import time

import pytest

from conftest import pid_alive, ranks_of, wait_until, worker_pids_of
from kernel_helper import Execution, Kernel

pytestmark = pytest.mark.kernel


def test_env_values_reach_every_rank(ddp2):
    ex = ddp2.run(
        "%%ddp --ordered\nimport os\n"
        "keys = ['MASTER_ADDR','MASTER_PORT','WORLD_SIZE','RANK','LOCAL_RANK','LOCAL_WORLD_SIZE',\n"
        "        'NODE_RANK','GROUP_RANK','ROLE_RANK','TORCHELASTIC_RUN_ID','OMP_NUM_THREADS']\n"
        "{k: os.environ.get(k) for k in keys}"
    ).ok()
    envs = ddp2.value("list(_)")
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    for e in envs:
        assert e["MASTER_ADDR"] == "127.0.0.1"
        assert e["WORLD_SIZE"] == "2" and e["LOCAL_WORLD_SIZE"] == "2"
        assert e["NODE_RANK"] == "0" and e["GROUP_RANK"] == "0"
        assert int(e["MASTER_PORT"]) > 0
        assert e["TORCHELASTIC_RUN_ID"]
        assert e["OMP_NUM_THREADS"] is not None
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert envs[0]["ROLE_RANK"] == "0" and envs[1]["ROLE_RANK"] == "1"
    assert "RankResults" in ex.result
    # The kernel's own env is untouched: nothing was written to os.environ there.
    assert ddp2.value("'RANK' in __import__('os').environ") is False


def test_process_group_is_initialised_with_gloo(ddp2):
    ddp2.run("%%ddp\n(dist.is_initialized(), dist.get_backend(), dist.get_world_size(), dist.get_rank())").ok()
    assert ddp2.value("[tuple(v) for v in _]") == [(True, "gloo", 2, 0), (True, "gloo", 2, 1)]


def test_state_persists_across_cells(ddp2):
    ddp2.run("%%ddp\ncounter = dist.get_rank() * 100\nmodel = torch.nn.Linear(2, 2)").ok()
    ddp2.run("%%ddp\ncounter += 1\n").ok()
    ddp2.run("%%ddp\n(counter, type(model).__name__)").ok()
    assert ddp2.value("[tuple(v) for v in _]") == [(1, "Linear"), (101, "Linear")]


def test_notebook_function_and_class_used_in_cell(ddp2):
    ddp2.run("def scale(x, k=3):\n    return x * k\n\nclass Box:\n    def __init__(self, v): self.v = v\n\nfactor = 5").ok()
    ddp2.run("%%ddp\nscale(dist.get_rank() + 1, factor) + Box(10).v").ok()
    assert ddp2.value("list(_)") == [15, 20]


def test_notebook_values_are_fresh_each_cell(ddp2):
    ddp2.run("threshold = 1").ok()
    ddp2.run("%%ddp\nthreshold").ok()
    assert ddp2.value("list(_)") == [1, 1]
    ddp2.run("threshold = 2").ok()
    ddp2.run("%%ddp\nthreshold").ok()
    assert ddp2.value("list(_)") == [2, 2]


def test_tensors_come_back_as_cpu_tensors(ddp2):
    ddp2.run("%%ddp\nt = torch.full((3, 4), float(dist.get_rank()))\ndist.all_reduce(t)\nt").ok()
    assert ddp2.value("[(type(v).__name__, str(v.device), tuple(v.shape), v.sum().item()) for v in _]") == [
        ("Tensor", "cpu", (3, 4), 12.0),
        ("Tensor", "cpu", (3, 4), 12.0),
    ]


def test_collective_gather_path(ddp2):
    """The all_gather path used for GPU tensors, exercised here with gloo on CPU tensors."""
    ddp2.run("%%ddp --gather collective\ntorch.arange(4) + 10 * dist.get_rank()").ok()
    assert ddp2.value("[v.tolist() for v in _]") == [[0, 1, 2, 3], [10, 11, 12, 13]]


def test_out_flag_and_semicolon(ddp2):
    ex = ddp2.run("%%ddp --out ranks_seen\ndist.get_rank();").ok()
    assert ex.result is None
    assert ddp2.value("list(ranks_seen)") == [0, 1]


def test_output_is_streamed_live_and_attributed(ddp2):
    ex = ddp2.run("%%ddp\nimport time\nprint('first', flush=True)\ntime.sleep(2.0)\nprint('second')").ok()
    firsts = [t for t, name, text in ex.stream_times if "first" in text]
    assert firsts and firsts[0] < ex.elapsed - 1.0, (firsts, ex.elapsed)
    assert "[rank 0] first" in ex.stdout and "[rank 1] first" in ex.stdout
    assert "[rank 1] second" in ex.stdout


def test_stderr_and_c_level_output_are_captured(ddp2):
    for _ in range(2):
        ddp2.run("%%ddp --no-widget\n1").ok()  # a quiet cell: its DONE follows the last markers, not new ones
        ex = ddp2.run(  # nothing but C, a raw fd write and a child on stdout: the rank's socket, not Python, says it was written
            "%%ddp\nimport sys, os, ctypes\nprint('to stderr', file=sys.stderr)\n"
            "os.write(1, b'raw fd write\\n')\nctypes.CDLL(None).puts(b'from C puts')\nctypes.CDLL(None).fflush(None)\n"
            "import subprocess; subprocess.run(['echo', 'from a child process'])"
        ).ok()
        # The same stderr line from every rank is shown once (when both come within the merge window).
        assert "[ranks 0-1] to stderr" in ex.stderr or ("[rank 0] to stderr" in ex.stderr and "[rank 1] to stderr" in ex.stderr)
        assert "[rank 0] raw fd write" in ex.stdout and "[rank 1] raw fd write" in ex.stdout
        assert "[rank 1] from C puts" in ex.stdout
        assert "[rank 0] from a child process" in ex.stdout and "[rank 1] from a child process" in ex.stdout


def test_ranks_filter_limits_display(ddp2):
    ex = ddp2.run("%%ddp --ranks 1\nprint('hello from', dist.get_rank())").ok()
    assert "[rank 1] hello from 1" in ex.stdout
    assert "rank 0" not in ex.stdout


def test_progress_redraws_leave_their_final_state(ddp2):
    """A line redrawn with \\r: the status view shows it live; the output keeps its final state, once."""
    ex = ddp2.run(
        "%%ddp --ranks 0\nimport sys, time\nfor i in range(3):\n    sys.stdout.write(f'\\rstep {i}'); sys.stdout.flush(); time.sleep(0.05)\nprint()"
    ).ok()
    assert "\r" not in ex.stdout and "step 0" not in ex.stdout
    assert "[rank 0] step 2\n" in ex.stdout


def test_error_on_one_rank_names_it_and_pool_survives(ddp2):
    ddp2.run("%%ddp\nsurvivor = 'still here'").ok()
    ex = ddp2.run("%%ddp\nx = 1\nif dist.get_rank() == 1:\n    raise ValueError('bad batch')\nx")
    assert ex.error is not None
    ename, evalue, tb = ex.error
    assert ename == "CellError"
    assert "rank 1 raised ValueError: bad batch" in evalue
    assert re.search(r"Cell In\[\d+\], line 4\n +raise ValueError", evalue), "the cell named as IPython names it, its line as the editor has it"
    text = "\n".join(tb)
    assert "pool.py" not in text and "magics.py" not in text, "internal frames leaked into the traceback"
    ddp2.run("%%ddp\nsurvivor").ok()
    assert ddp2.value("list(_)") == ["still here", "still here"]


def test_syntax_error_is_reported_in_the_kernel_and_nothing_runs(ddp2):
    ddp2.run("%%ddp\nmarker = 'before'").ok()
    ex = ddp2.run("%%ddp\nmarker = 'after'\nif True print('x')")
    assert ex.error is not None and "SyntaxError" in ex.error[1] and "(line 3)" in ex.error[1]  # the editor's line: %%ddp is line 1
    ddp2.run("%%ddp\nmarker").ok()
    assert ddp2.value("list(_)") == ["before", "before"]


SESSION = "get_ipython().magics_manager.registry['DDPMagics'].session"


def prompt_of(k: Kernel, ex: Execution) -> int:
    """The prompt number a notebook shows for the cell ``ex`` ran: its execute_reply's execution_count."""
    msg_id = ex.messages[0]["parent_header"]["msg_id"]
    while True:
        reply = k.kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            return int(reply["content"]["execution_count"])


def test_tracebacks_name_the_prompt_number_and_the_editor_s_line(ddp2):
    """``Cell In[n]`` is the prompt the cell ran under (ordinary cells between, cells run again), line k the editor's:
    the %%ddp line is line 1. The panel's metrics, the session's last cell and %ddp_export's history use the same n."""
    define = "%%ddp\nimport ddp_magic\ndef scaled(x):\n    return x / (dist.get_rank() - 1)  # rank 1 divides by zero"
    call = "%%ddp\nddp_magic.log(step=0, seen=1.0)\ny = 2.0\nscaled(y)"
    for _ in range(2):
        defined = prompt_of(ddp2, ddp2.run(define).ok())
        for ordinary in ("1 + 1", "x_nb = 3"):
            ddp2.run(ordinary).ok()
        shown = []
        for _ in range(2):
            ex = ddp2.run(call)
            number = prompt_of(ddp2, ex)
            shown.append(number)
            assert ex.error is not None and ex.error[1].startswith("rank 1 raised ZeroDivisionError"), ex.error
            assert re.search(rf"  Cell In\[{number}\], line 4\n +scaled\(y\)\n", ex.error[1]), (number, ex.error[1])
            assert re.search(rf"  Cell In\[{defined}\], line 4, in scaled\n +return x / ", ex.error[1]), (defined, ex.error[1])
            assert f"Cell In[{number + 1}]" not in ex.error[1]
            last = ddp2.value(f"({SESSION}.last.number, {SESSION}.metrics.label, [c.number for c in {SESSION}.history.cells if 'scaled(y)' in c.source][-1])")
            assert last == (number, str(number), number)
        assert defined < shown[0] < shown[1]  # run again, the cell is named by its new prompt


def test_magic_syntax_in_cell_gets_a_hint(ddp2):
    ex = ddp2.run("%%ddp\n!nvidia-smi")
    assert ex.error is not None and "magics and ! shell commands" in ex.error[1]


def test_unpicklable_variable_is_named(ddp2):
    ddp2.run("import threading\nmy_lock = threading.Lock()").ok()
    ex = ddp2.run("%%ddp\nprint(my_lock)")
    assert ex.error is not None
    assert ex.error[0] == "ShipError" and "'my_lock'" in ex.error[1] and "inside the %%ddp cell" in ex.error[1]
    assert len(ex.error[2]) <= 3, "the error must be short, not a wall of traceback"


def test_unpicklable_result_names_rank_and_keeps_others(ddp2):
    ex = ddp2.run("%%ddp\nimport threading\nthreading.Lock() if dist.get_rank() == 1 else 'fine'").ok()
    assert "rank 1" in ex.stdout and "lock" in ex.stdout  # a notice (stdout): the others' results came back
    assert ddp2.value("[repr(v)[:40] for v in _]")[0] == "'fine'"


def test_bad_flags_are_short_usage_errors(ddp2):
    for line, needle in [("-n 0", "1 or more"), ("-n two", "not a whole number"), ("--bogus", "unrecognized arguments"), ("--ranks 7", "ranks 0..1")]:
        ex = ddp2.run(f"%%ddp {line}\n1")
        assert ex.error is not None and ex.error[0] == "UsageError", (line, ex.error)
        assert needle in ex.error[1], (line, ex.error[1])
        if needle != "ranks 0..1":  # a parser's error points to the generated help
            assert ex.error[1].endswith("See %ddp? for every option, with examples."), ex.error[1]


def test_help_and_log_actions(kernel):
    ex = kernel.run("%%ddp -h\n1").ok()
    assert "show this help" in ex.stdout and "%ddp log" in ex.stdout and "%%ddp -n 4" in ex.stdout
    ex = kernel.run("%ddp log").ok()
    assert ex.stdout.startswith("ddp_magic log:") and "DDP_MAGIC_LOG=debug" in ex.stdout


def test_busy_master_port_is_named():
    k = Kernel()
    try:
        k.run("%load_ext ddp_magic").ok()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            port = s.getsockname()[1]
            ex = k.run(f"%%ddp -n 2 --master-port {port}\n1")
            assert ex.error is not None and ex.error[0] == "UsageError"
            assert str(port) in ex.error[1] and "in use" in ex.error[1]
            assert ranks_of(k.pid) == [], "a failed start must spawn nothing"
    finally:
        k.shutdown()


def test_rank_that_exits_is_reported_and_pool_restarts(ddp2):
    t0 = time.monotonic()
    ex = ddp2.run("%%ddp\nimport os, time\nprint('about to go', flush=True)\nif dist.get_rank() == 1:\n    os._exit(3)\n"
                  "time.sleep(30)\nprint('rank 0 slept', flush=True)")
    print(f"dead rank reported in {time.monotonic() - t0:.2f}s")  # the figure: bench/bench_recovery.py's failures table
    assert ex.error is not None
    assert "rank 1" in ex.error[1] and "exited with code 3" in ex.error[1]
    assert "rank 0 slept" not in ex.stdout, "reported while rank 0 still slept, not once its cell was over"
    ex = ddp2.run("%%ddp\nimport torch.distributed as dist\ndist.get_rank()").ok()
    assert "started it again" in ex.stdout  # a notice (stdout); rank 1 alone: rank 0 kept its state
    assert ddp2.value("list(_)") == [0, 1]
    ddp2.run("%%ddp\nimport torch, torch.distributed as dist").ok()


def test_changing_n_restarts_with_notice_and_n_may_be_omitted(kernel):
    kernel.run("%%ddp -n 2\nimport torch.distributed as dist").ok()
    ex = kernel.run("%%ddp -n 3\nimport torch.distributed as dist\ndist.get_world_size()").ok()
    assert "restarting the pool" in ex.stdout and "-n 2 → 3" in ex.stdout and "restarting" not in ex.stderr  # a notice is not an error
    assert kernel.value("list(_)") == [3, 3, 3]
    kernel.run("%%ddp\ndist.get_world_size()").ok()
    assert kernel.value("list(_)") == [3, 3, 3]
    kernel.run("%ddp stop").ok()
    ex = kernel.run("%%ddp\n1")
    assert ex.error is not None and "give the number of ranks" in ex.error[1]


def test_stop_and_restart_magics(kernel):
    kernel.run("%%ddp -n 2\nimport os\nos.getpid()").ok()
    pids = kernel.value("list(_)")
    assert all(pid_alive(p) for p in pids)
    ex = kernel.run("%ddp restart").ok()
    assert "ready" in ex.stdout
    kernel.run("%%ddp\nimport os\nos.getpid()").ok()
    new_pids = kernel.value("list(_)")
    assert set(new_pids).isdisjoint(pids)
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), 5)
    ex = kernel.run("%ddp status").ok()
    assert "rank 1: pid" in ex.stdout
    kernel.run("%ddp stop").ok()
    assert wait_until(lambda: not any(pid_alive(p) for p in new_pids), 5)
    assert wait_until(lambda: worker_pids_of(kernel.pid) == [], 5), worker_pids_of(kernel.pid)


def test_a_start_that_failed_leaves_no_option_to_the_next_n(kernel):
    """A newcomer's order: a pool over hosts that cannot start, then a plain -n cell: it runs here, twice; a bare cell
    after a failed start retries the options it failed with."""
    kernel.run("%ddp stop")
    for _round in range(2):
        ex = kernel.run("%%ddp --hosts nosuchhost.invalid -n 2\n1", timeout=120)
        assert ex.error is not None and ex.error[0] == "StartError" and "nosuchhost.invalid: its name does not resolve" in ex.error[1], ex.error
        ex = kernel.run("%%ddp\n1", timeout=120)
        assert ex.error is not None and "nosuchhost.invalid" in ex.error[1], "a bare cell retries what failed"
        ex = kernel.run("%%ddp -n 2\nimport socket\nsocket.gethostname()", timeout=180).ok()
        assert kernel.value("list(_)") == [socket.gethostname()] * 2, "-n 2 after the failed start is a pool on this host"
        kernel.run("%ddp stop").ok()


def test_ddp_env_plan_and_live(kernel):
    ex = kernel.run("%ddp_env -n 3").ok()
    assert re.match(r"planned env for 3 ranks\b.* — ✓ \d+ checks passed", ex.result), "a healthy plan: the verdict, not every check"
    assert "ranks 0..2 exactly once" in kernel.run("print(_.full_text())").ok().stdout, "every check one call away"
    kernel.run("%%ddp -n 2\n1").ok()
    ex = kernel.run("%ddp_env").ok()
    assert "live env of 2 ranks," in ex.result and "initialised on 2/2 ranks" in kernel.run("print(_.full_text())").ok().stdout
    kernel.run("env_data = %ddp_env --json").ok()
    data = kernel.value("{k: v for k, v in env_data.items() if k in ('ok', 'state')}")
    assert data == {"ok": True, "state": "live"}


def test_kernel_sigkill_leaves_no_worker():
    k = Kernel()
    k.run("%load_ext ddp_magic").ok()
    k.run("%%ddp -n 2\nimport os\nos.getpid()", timeout=180).ok()
    kpid = k.pid
    workers = worker_pids_of(kpid)
    assert len(workers) >= 3, workers  # the template and two ranks
    os.kill(kpid, signal.SIGKILL)
    t0 = time.monotonic()
    gone = wait_until(lambda: not any(pid_alive(p) for p in workers), 10)
    print(f"workers gone {time.monotonic() - t0:.2f}s after the kernel's SIGKILL")
    with contextlib.suppress(Exception):  # the kernel is gone: its channels may already be closed
        k.kc.stop_channels()
        k.km.cleanup_resources()
    assert gone, [p for p in workers if pid_alive(p)]


def test_notebook_function_sees_worker_globals_and_fresh_notebook_values(ddp2):
    ddp2.run("%%ddp\nimport torch.distributed as dist\nweights = dist.get_rank() + 1").ok()
    ddp2.run("bias = 10\ndef helper(v):\n    return v + bias\ndef score():\n    return helper(weights * 100) + dist.get_world_size()").ok()
    ddp2.run("%%ddp\nscore()").ok()
    assert ddp2.value("list(_)") == [112, 212]
    ddp2.run("bias = 20").ok()
    ddp2.run("%%ddp\nscore()").ok()
    assert ddp2.value("list(_)") == [122, 222]
    # The newest definition wins: the notebook's later `weights` replaces the workers' copy...
    ddp2.run("weights = -1").ok()
    ddp2.run("%%ddp\nscore()").ok()
    assert ddp2.value("list(_)") == [-78, -78]
    # ...and a %%ddp cell's later one stays on the workers, whatever the notebook holds.
    ddp2.run("%%ddp\nweights = dist.get_rank() + 1").ok()
    ddp2.run("%%ddp\nscore()").ok()
    assert ddp2.value("list(_)") == [122, 222]


def test_kernel_imports_torch_in_the_background():
    """The first tensor result needs torch in the kernel: it is imported (at nice 10) while the ranks start
    (with the warm-up at %load_ext off; test_template.py has it on)."""
    k = Kernel(extra_env={"DDP_MAGIC_WARM_TEMPLATE": "0"})
    try:
        k.run("%load_ext ddp_magic").ok()
        assert k.value("'torch' in __import__('sys').modules") is False
        k.run("%%ddp -n 1 --no-widget\n1", timeout=180).ok()  # a plain value: nothing in the cell needs torch here
        assert wait_until(lambda: k.value("'torch' in __import__('sys').modules"), 60, 0.2), "the background import of torch"
        k.run("%ddp stop").ok()
    finally:
        k.shutdown()
