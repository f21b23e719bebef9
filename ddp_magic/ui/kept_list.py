"""This notebook's kept pools as the DDP panel lists them: one row of short facts each (id, notebook, ranks, job,
kernel, lease), the same whether the kernel has ddp_magic loaded (the comm's snapshot, labsnap.py) or not.

After a kernel restart ddp_magic is not loaded yet, and the panel still lists them (docs/keep.md): it asks the new
kernel with a silent execute whose one user expression is ``panel_rows()`` (labextension/src/kept_probe.ts): no
output, no history, no execution count, no name in the user's namespace; only this module and the kept-pool files'
reader are imported.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

log = logging.getLogger(__name__)


def kept_rows(notebook: Optional[str] = None) -> List[Dict[str, Any]]:
    """The kept pools of ``notebook`` (default: this kernel's, JPY_SESSION_NAME), ended ones included: each row's
    fields (kernel/keep/attach.py ``Found.fields``), ``alive``, and ``text``, the ``%ddp attach --list`` line."""
    from ..kernel.keep.attach import found_pools
    from ..kernel.keep.keeping import notebook_name

    notebook = notebook_name() if notebook is None else notebook
    if not notebook:
        return []
    return [dict(f.fields(), alive=f.alive and f.data.get("state") != "ended", text=f.line())
            for f in found_pools() if f.data.get("notebook") == notebook]


class KeptRows(list):
    """A user expression's value that IPython formats as ``application/json`` (the panel reads that, not a repr)."""

    def _repr_json_(self) -> List[Dict[str, Any]]:
        return list(self)


def panel_rows() -> KeptRows:
    """``kept_rows()`` for the panel's silent question, or none when they cannot be read (logged): it must never fail."""
    try:
        return KeptRows(kept_rows())
    except Exception:  # a listing the panel asked for without the magic: never an error in the kernel
        log.debug("kept_list: could not list the kept pools", exc_info=True)
        return KeptRows()
