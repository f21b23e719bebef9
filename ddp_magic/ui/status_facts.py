"""What the status view knows of a pool's plan: its backend, its env checks and each rank's env, computed once per plan.

A mixin of status_view.StatusView (which sets ``_plan``, ``_pool`` and ``_fixed_checks``), kept apart so the
presenter stays about presenting.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ..logs import log
from ..plan import DIST_VARS, Check, Plan, plan_checks


_ENVS: Dict[str, List[Dict[str, str]]] = {}  # run id -> each rank's DIST_VARS: a new view per cell reuses them
_ENVS_KEPT = 4  # plans remembered (a pool's plan, and a few it replaced)


def _plan_envs(plan: Plan) -> List[Dict[str, str]]:
    """Each rank's DIST_VARS of ``plan``, once per plan, not once per cell's view (1,024 dicts a cell at scale)."""
    envs = _ENVS.get(plan.run_id)
    if envs is None:
        envs = [{k: v for k, v in env.items() if k in DIST_VARS} for env in plan.all_envs()]
        while len(_ENVS) >= _ENVS_KEPT:
            _ENVS.pop(next(iter(_ENVS)))
        _ENVS[plan.run_id] = envs
    return envs


class PlanFacts:
    """The plan's facts, cached by the plan's run id."""

    _plan: Optional[Plan] = None
    _pool: Any = None
    _fixed_checks: Optional[List[Check]] = None
    _checks: List[Check] = []
    _checks_for: Optional[str] = None
    _envs: List[Dict[str, str]] = []
    _envs_for: Optional[str] = None

    @property
    def plan(self) -> Optional[Plan]:
        if self._pool is not None:
            return getattr(self._pool, "plan", self._plan)
        return self._plan

    @property
    def backend(self) -> str:
        plan = self.plan
        return plan.backend if plan is not None else ""

    @property
    def checks(self) -> List[Check]:
        """The checks of the pool's plan, computed once per plan."""
        if self._fixed_checks is not None:
            return self._fixed_checks
        plan = self.plan
        if plan is None:
            return []
        if self._checks_for != plan.run_id:
            try:
                self._checks = plan_checks(plan, started=bool(getattr(self._pool, "started", False)))
            except Exception as e:  # a check must never break a cell
                log.debug("the status view could not run the env checks", exc_info=True)
                self._checks = [Check("env checks", False, f"could not run: {type(e).__name__}: {e}", level="warning")]
            self._checks_for = plan.run_id
        return self._checks

    def _rank_envs(self) -> List[Dict[str, str]]:
        """The DIST_VARS each rank of the plan receives, computed once per plan."""
        plan = self.plan
        if plan is None:
            return []
        if self._envs_for != plan.run_id:
            self._envs = _plan_envs(plan)
            self._envs_for = plan.run_id
        return self._envs
