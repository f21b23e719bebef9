"""A rank that torchrun started on any node (``python -m ddp_magic.procs.worker --connect HOST:PORT``): its config
from torchrun's env and its command line, the pool's secret from the file the kernel named."""
from __future__ import annotations

import os


def torchrun_config(argv: list) -> "tuple[dict, bytes]":
    """A rank started by torchrun on any node: env from torchrun, the kernel's address from argv."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ddp_magic.procs.worker", description="a ddp_magic rank started by torchrun")
    ap.add_argument("--connect", required=True, metavar="HOST:PORT", help="the kernel's control channel")
    ap.add_argument("--secret-file", default=os.environ.get("DDP_MAGIC_SECRET_FILE"), help="file holding the pool's secret (hex)")
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--no-init", action="store_true")
    args = ap.parse_args(argv)
    if not args.secret_file:
        ap.error("--secret-file (or DDP_MAGIC_SECRET_FILE) is required: the kernel printed its path")
    with open(os.path.expanduser(args.secret_file)) as f:
        secret = bytes.fromhex(f.read().strip())
    host, _, port = args.connect.rpartition(":")
    os.environ["DDP_MAGIC_BACKEND"] = args.backend
    os.environ["DDP_MAGIC_INIT"] = "0" if args.no_init else "1"
    os.environ.setdefault("NODE_RANK", os.environ.get("GROUP_RANK", "0"))
    return {"env": dict(os.environ), "kernel_addr": host.strip("[]"), "kernel_port": int(port)}, secret
