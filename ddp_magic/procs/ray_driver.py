"""The Ray pool's driver: the kernel's child (as srun is a Slurm pool's) that places the node templates on a Ray cluster and relays their lines.

Started by kernel/launchers/ray.py under procs/anchor.py, so it ends with the kernel, even a
SIGKILLed one. It connects to the cluster (``ray.init``; Ray's own log path off: nothing of
the ranks passes through Ray), checks before anything is placed (the versions, the token,
resources that can never fit: one line each, an ``refused`` event), asks for a placement
group (one bundle a node, or one a rank that Ray packs) and says ``waiting`` each second
while it is pending, then starts one procs/ray_actor.py actor a node, which starts that
node's template (procs/ray_group.py). From there it is srun's part: every line on its stdin
goes to every template, every template's line comes out on its stdout, and a node whose
actor or template ended is a ``lost`` event naming it; the kernel may ask for a lost node to
be placed again. Its stdin closing or SIGTERM removes the placement group and the actors;
its death without that (SIGKILL) leaves Ray to end the job's non-detached actors and
placement group, whose templates follow their actors. A kept pool's driver outlives the
kernel under the lease instead (procs/ray_keep.py: its stdin's end no longer ends it, the
lease's end does).
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any, List, Optional

from ..logs import log
from .ray_group import Driver, cluster_nodes, emit, free_per_node, free_text
from .ray_place import never_fits, pack_preview


def said(error: BaseException) -> str:
    """Ray's error in one line, with the fix: a version mismatch, a missing or wrong token, no cluster there."""
    text = str(error)
    if "Version mismatch" in text:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(("Ray:", "Python:"))]
        there, here = " ".join(lines[:2]), " ".join(lines[2:4])
        return f"Ray or Python differ between the cluster ({there}) and this kernel ({here}): install the cluster's versions here"
    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 8:  # ray.init's ConnectionError hides the AuthenticationError
        chain.append(chain[-1].__cause__)
    words = " ".join(f"{type(e).__name__}: {e}" for e in chain).lower()  # its cause may be a RuntimeError quoting the traceback
    if "authenticationerror" in words or "invalidauthtoken" in words or "token" in text.lower():
        return ("Ray's token authentication refused this kernel (the token is missing or wrong): give the cluster's token as "
                "RAY_AUTH_TOKEN or in ~/.ray/auth_token (RAY_AUTH_TOKEN_PATH) in the kernel's env (docs/ray.md)")
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return f"could not connect to a cluster: {first}"


def connect(args: argparse.Namespace) -> Optional[Any]:
    """``ray`` connected to the cluster, or None once the refusal was said."""
    try:
        import ray
    except ImportError as e:
        emit({"event": "refused", "why": f"Ray is not installed for {sys.executable} ({e}): pip install 'ddp-magic[ray]'"})
        return None
    try:
        ray.init(address=args.address, log_to_driver=False, logging_level=logging.WARNING, namespace="ddp_magic",
                 include_dashboard=False, configure_logging=False)
    except BaseException as e:  # Ray's words, in one line with the fix
        log.debug("ray.init failed", exc_info=True)
        emit({"event": "refused", "why": said(e)})
        return None
    return ray


def gcs_address(ray: Any) -> str:
    """The cluster's GCS address as a node joins it (``ray start --address ...``), "" when Ray does not say."""
    try:
        return str(ray.get_runtime_context().gcs_address or "")
    except Exception:  # another Ray
        log.debug("the GCS address could not be read", exc_info=True)
        return ""


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ddp_magic.procs.ray_driver")
    parser.add_argument("--address", default="auto")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--per-node", type=int, default=1)
    parser.add_argument("--gpus", type=float, default=0.0)
    parser.add_argument("--cpus", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=0.0)
    parser.add_argument("--pack", action="store_true", help="a bundle a rank (nodes x per-node of them), PACK: -n N alone")
    parser.add_argument("--plan-only", action="store_true", help="the cluster's nodes and versions, nothing placed (%%ddp_env)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the kernel's: it ends us by closing our stdin
    ray = connect(args)
    if ray is None:
        return
    driver = Driver(ray, args)
    nodes = cluster_nodes(ray)
    bundles = driver.bundles()
    why = never_fits(bundles, args.per_node, nodes, packed=args.pack)
    info = {"ray": ray.__version__, "python": sys.version.split()[0], "cluster": nodes, "free": free_text(ray, bundles), "gcs": gcs_address(ray)}
    if why or args.plan_only:
        if args.pack and not why:  # where Ray would pack them with what is free now (it decides at placement)
            info["would"] = pack_preview(bundles[0], len(bundles), free_per_node(ray, list(bundles[0])))
        emit(dict({"event": "refused", "why": why} if why else {"event": "plan"}, **info))
        return
    signal.signal(signal.SIGTERM, driver.end)
    threading.Thread(target=driver.relay_then_end, name="ddp-ray-in", daemon=True).start()
    if not driver.place():
        emit({"event": "refused", "why": f"the placement group was still pending after --start-timeout {args.timeout:g}s "
                                          f"({free_text(ray, driver.bundles())}); it was removed"})
        driver.end()
    placed = driver.start_actors()
    emit({"event": "placed", "nodes": placed, "pg": driver.pg.id.hex(), **info})
    driver.ending.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
