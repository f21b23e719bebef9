"""The magics' options and examples, declared once: what ``%%ddp``, ``%ddp``, ``%ddp_env`` accept and ``%ddp?`` shows.

IPython's ``magic_arguments`` declarations as data (magics.py applies them), so the
help text, the parsers and the examples have one home, apart from what the magics do.
"""
from __future__ import annotations

import shlex
from typing import Any, Callable, Dict, List, Optional, TypeVar

from IPython.core.magic_arguments import arg_split, argument

from .plan.spec import BACKENDS, port as _port, positive_int as _positive_int

SEE_HELP = "See %ddp? for every option, with examples."

POOL_KEYS = ("backend", "master_addr", "master_port", "init", "start_method", "nnodes", "start_timeout", "pg_timeout", "mesh")
F = TypeVar("F", bound=Callable[..., Any])

CELL_EXAMPLES = """
examples:
  %%ddp -n 4                 run on 4 ranks (starts the pool on first use; later cells may omit -n)
  %%ddp --ranks 0            show only rank 0's output (every rank still runs)
  %%ddp --timeout 60         stop the cell after 60 s, showing where every rank was
  %%ddp --out losses         also store the per-rank results in the notebook variable `losses`
  %%ddp --no-widget          no status view above the output (DDP_MAGIC_WIDGET=0 in the env: never)
  %%ddp -n 8 --nnodes 2      8 ranks over 2 nodes (torchrun); the kernel prints what to run on the other node
  %%ddp -n 8 --slurm         8 ranks as tasks of this kernel's Slurm allocation (inside salloc / sbatch / OnDemand)
  %%ddp --slurm --nodes 2 --ntasks-per-node 4 --partition gpu --time 2:00:00
                             a new allocation of ours (released when the pool stops or the kernel ends; docs/multinode.md)
  %%ddp --hosts gpu1,gpu2 --ntasks-per-node 8    ranks on your hosts over your ssh (or gpu1:8,gpu2:8; docs/multinode.md)
  %%ddp --hostfile ~/hosts   DeepSpeed's hostfile: "gpu1 slots=8" a line
  %%ddp --restart            a fresh pool first (fresh port; state on the workers is lost)
  %%ddp --scatter x          rank r gets only its shard of the notebook tensor x (ddp_magic.scatter(x, dim=1) for another dim)
  %%ddp --profile trace.json torch.profiler on every rank, one merged trace, a straggler table (docs/metrics.md)
  %%ddp --bg --out job       run in the background; job.wait(), job.result(), job.cancel() (docs/background.md)
  %%ddp --bg --save-every 10m ckpt/   a snapshot in ckpt/ at the first safe point (ddp_magic.log(step=…)) after each 10 min
  %%ddp --peek [--ranks 0]   look into the running ranks: step, model.weight.norm() (no collectives)
"""
LINE_EXAMPLES = """
examples:
  %ddp status                the pool's ranks, pids and states
  %ddp restart [-n N]        restart the pool (fresh port, state on the workers is lost)
  %ddp stop                  stop every worker
  %ddp log                   ddp_magic's recent log records, to attach to a bug report
  %ddp wait                  wait for the background cells (%%ddp --bg) to end
  %ddp autoreload [off]      before each %%ddp cell every rank reloads the modules whose files changed (the kernel's
                             %autoreload 2 turns it on too; docs/autoreload.md)
  %ddp output --rank 517     rank 517's whole output of the last %%ddp cell, what the cell held back included
                             (--cell 12: of In [12]; a background job: job.output(517))
  %ddp stacks [--ranks 0-3]  every rank's stack now, identical ones once (--all-threads, --native with py-spy; job.stacks())
  %ddp metrics [--df]        what the last cell's ranks logged with ddp_magic.log: a dict of lists (--df: a DataFrame)
                             (DDP_MAGIC_LOG=debug in the kernel's env also prints them as they happen)
  %ddp keep [--idle 30m] [--max 24h]   the pool outlives this kernel (--off: it ends with it again; docs/keep.md)
  %ddp attach [--out job] [--force] [ID]   from a new kernel: take a kept pool on, its running job as `job` (--list: all)
  %ddp save ckpt/ [model opt]   every name the ranks own (or these) as a new snapshot in ckpt/ (docs/snapshots.md)
  %ddp load ckpt/ [-n 2]     the newest snapshot in ckpt/ into this pool, or a new one (--into model,opt: fill those)
  %ddp snapshots ckpt/       the snapshots there, one a line: step, time, ranks, bytes, names
  %ddp_env [-n N]            the env each rank will get (or sees, once the pool runs), with checks
  %ddp_env --slurm --nodes 2 --ntasks-per-node 4    the Slurm plan (salloc and srun lines, each rank's env), nothing allocated
"""


POOL_ARGUMENTS = (
    argument("-n", "--nproc", type=_positive_int, metavar="N", help="number of ranks (processes); a cell may omit it once a pool runs"),
    argument("--backend", choices=BACKENDS, help="process-group backend (default auto: nccl with a GPU per rank, else gloo)"),
    argument("--master-addr", metavar="ADDR", help="MASTER_ADDR (default 127.0.0.1)"),
    argument("--master-port", type=_port, metavar="PORT", help="MASTER_PORT (default: a free port)"),
    argument("--no-init", dest="init", action="store_const", const=False, help="do not call init_process_group before the first cell"),
    argument("--start-method", choices=("auto", "fork", "spawn"), help="fork server (fast, Linux) or spawn"),
    argument("--nnodes", type=_positive_int, metavar="N", help="spread the -n ranks over this many nodes (torchrun c10d rendezvous)"),
    argument("--join-timeout", dest="start_timeout", type=float, metavar="SECONDS", help="wait for every rank (and node) to join (default 180)"),
    argument("--pg-timeout", type=float, metavar="SECONDS", help="before a collective with a missing peer fails (default 300)"),
    argument("--nccl-debug", choices=("WARN", "INFO", "TRACE"), help="set NCCL_DEBUG on the ranks (NCCL's own output appears per rank)"),
    argument("--mesh", metavar="DIMS", help="a DeviceMesh named `mesh` on every rank, e.g. dp=2,tp=2 (sizes multiply to -n); none: no mesh"),
    argument("--slurm", action="store_true", help="ranks as a Slurm job step: in this kernel's allocation (SLURM_JOB_ID), else in a new one"),
    argument("--nodes", type=_positive_int, metavar="N", help="--slurm: nodes (default: the allocation's, else 1)"),
    argument("--ntasks-per-node", type=_positive_int, metavar="N", help="--slurm, --hosts: ranks per node (default: -n / nodes)"),
    argument("--partition", metavar="P", help="--slurm: the partition to allocate in"),
    argument("--time", metavar="T", help="--slurm: the allocation's time limit, as Slurm reads it (2:00:00)"),
    argument("--gpus-per-node", type=_positive_int, metavar="G", help="--slurm: GPUs per node, one per local rank"),
    argument("--account", metavar="A", help="--slurm: the account to charge"),
    argument("--slurm-args", metavar="ARGS", help='--slurm: more salloc options, e.g. "--qos=high --constraint=a100"'),
    argument("--start-timeout", dest="queue_timeout", type=float, metavar="SECONDS",
             help="--slurm: cancel a job still queued after this long (default: wait; Ctrl-C cancels)"),
    argument("--hosts", metavar="HOSTS", help="ranks on these hosts over your ssh: gpu1,gpu2 (with --ntasks-per-node) or gpu1:8,gpu2:8"),
    argument("--hostfile", metavar="FILE", help='--hosts from a DeepSpeed hostfile: "gpu1 slots=8" a line, # comments'),
    argument("--remote-python", metavar="PATH", help="--hosts: the python on the hosts (default: this kernel's path)"),
    argument("--ray", action="store_true", help="ranks on a Ray cluster (RAY_ADDRESS, or the one this host belongs to): a template a node, "
             "placed by a placement group (docs/ray.md)"),
    argument("--address", metavar="HOST:PORT", help="--ray: the cluster's GCS address, e.g. 198.51.100.10:6379"),
    argument("--gpus-per-rank", type=float, metavar="G", help="--ray: GPUs Ray gives each rank (default 0; 1 makes the backend nccl)"),
    argument("--cpus-per-rank", type=float, metavar="C", help="--ray: CPUs Ray gives each rank (default 1)"),
    argument("--control-addr", metavar="ADDR", help="where the ranks dial the kernel (default: loopback, or the address that reaches the first node)"),
    argument("--iface", metavar="NAME", help="across hosts: the interface the collectives use on every node, e.g. fast0 "
             "(default: each node's interface on its route to MASTER_ADDR; GLOO_SOCKET_IFNAME, when set, wins)"),
)
SSH_KEYS = ("hosts", "hostfile", "remote_python")
RAY_KEYS = ("nodes", "ntasks_per_node", "address", "gpus_per_rank", "cpus_per_rank", "queue_timeout")
SLURM_KEYS = ("nodes", "ntasks_per_node", "partition", "time", "gpus_per_node", "account", "slurm_args", "queue_timeout")
PREEMPT_SIGNAL = "--signal=USR1@120"  # what --save-on-preempt asks salloc for: SIGUSR1 to every step two minutes before the time limit
HELP_ARGUMENT = argument("-h", "--help", action="store_true", help="show this help")


def pool_arguments(func: F) -> F:
    """The pool's options, shared by %%ddp, %ddp restart and %ddp_env (declared once, above)."""
    for arg in reversed(POOL_ARGUMENTS):  # magic_arguments reads decorators bottom-up
        func = arg(func)
    return func


KEEP_ARGUMENTS = (
    argument("target", nargs="?", metavar="ID",
             help="with attach: the kept pool's id (default: this notebook's, else the only one); with autoreload: on (the default) or off; "
             "with save, load, snapshots: the snapshots' folder"),
    argument("--idle", metavar="T", help="with keep: end the pool after this long with no kernel and no job (default 30m)"),
    argument("--max", metavar="T", help="with keep: end the pool this long after keep, whatever it does (default 24h)"),
    argument("--off", action="store_true", help="with keep: the pool ends with its kernel again"),
    argument("--force", action="store_true", help="with attach: take the pool from the kernel attached to it now"),
    argument("--list", action="store_true", help="with attach: list this user's kept pools"),
    argument("--out", metavar="NAME", help="with attach: the running job's handle goes to this notebook variable"),
)


def keep_arguments(func: F) -> F:
    """%ddp keep's and %ddp attach's options (docs/keep.md)."""
    for arg in reversed(KEEP_ARGUMENTS):
        func = arg(func)
    return func


SNAPSHOT_ARGUMENTS = (
    argument("names", nargs="*", metavar="NAME", help="with save: only these names (default: every name the ranks own)"),
    argument("--into", metavar="NAMES", help="with load: fill these objects (model,opt), which a setup cell built, instead of rebuilding them"),
)


def snapshot_arguments(func: F) -> F:
    """%ddp save's, load's and snapshots' options (docs/snapshots.md)."""
    for arg in reversed(SNAPSHOT_ARGUMENTS):
        func = arg(func)
    return func


def where_request(args: Any) -> Dict[str, Any]:
    """Where the ranks run, as the line asked: {"ssh": ...} for --hosts / --hostfile (--ntasks-per-node is then theirs),
    {"slurm": ...} for any Slurm option, else {}."""
    ray = {k: getattr(args, k) for k in RAY_KEYS if getattr(args, k, None) is not None}
    if getattr(args, "ray", False) or getattr(args, "address", None) or getattr(args, "gpus_per_rank", None) or getattr(args, "cpus_per_rank", None):
        return {"ray": ray, **({"slurm": {}} if args.slurm else {})}  # with --slurm too, the spec refuses both (plan/spec.py)
    ssh = {k: getattr(args, k) for k in SSH_KEYS if getattr(args, k) is not None}
    if ssh:  # with --slurm too, the spec refuses both (plan/spec.py)
        if args.ntasks_per_node is not None:
            ssh["ntasks_per_node"] = args.ntasks_per_node
        return {"ssh": ssh, **({"slurm": {}} if args.slurm else {})}
    slurm = {k: getattr(args, k) for k in SLURM_KEYS if getattr(args, k) is not None}
    if args.slurm or slurm:  # any Slurm option means --slurm
        if "slurm_args" in slurm:
            slurm["extra"] = tuple(option_words(slurm.pop("slurm_args")))
        if getattr(args, "save_on_preempt", None):  # Slurm's warning before the time limit (ui/preempt.py)
            slurm["extra"] = (*slurm.get("extra", ()), PREEMPT_SIGNAL)
        return {"slurm": slurm}
    return {}


def parse_line(magic: Any, line: str) -> Any:
    """A magic's arguments, its positionals anywhere among the options: `%ddp attach --force 3fa9` names the pool
    after an option (argparse's plain parse takes the positionals in one run, and refused the id as unrecognized)."""
    args = magic.parser.parse_intermixed_args(arg_split(line))
    if getattr(args, "names", None) and args.action != "save":  # only %ddp save takes names: another action's extra word is refused
        magic.parser.error("unrecognized arguments: " + " ".join(args.names))
    return args


def cell_argv(text: Optional[str]) -> Optional[List[str]]:
    """``--argv "--epochs 3 --lr 0.1"``: IPython's line splitting keeps the quotes, so one quoted whole is the arguments."""
    return None if text is None else ["ddp_cell"] + option_words(text)


def option_words(text: str) -> List[str]:
    """The words of an option's value, one quoted whole (as IPython's line splitting keeps it) split again."""
    parts = shlex.split(text)
    if len(parts) == 1 and len(text) > 1 and text[0] in "\"'" and text[-1] == text[0]:
        parts = shlex.split(parts[0])
    return parts
