"""Validated configuration: targets and recipes (``targets``), gates.yaml (``gates``), the suites
of ``eval_suites/`` (``suites``), ``QUANTGATE_*`` settings (``environment``), and the YAML loader
whose errors name ``file:line`` and the nearest valid key (``loader``), and where the project and the
cache are (``paths``: ``project_root``, ``cache_dir``).

Config is immutable data checked once at the boundary, so a typo fails before any build. It sits
below every stage and imports none: a recipe's engine, a target's formats and a suite's kind are checked
against ``quantgate.declarations``. Other modules import the names listed here, not the modules.
"""

from typing import TYPE_CHECKING

from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.config.environment import expanded, overridden, path_setting, setting
    from quantgate.config.gates import (
        Floor,
        Gates,
        Tenant,
        check_target_names,
        load_gates,
        project_suites,
        resolve_targets,
    )
    from quantgate.config.identity import content_digest, file_digest
    from quantgate.config.loader import load_model, project_of
    from quantgate.config.paths import cache_dir, project_root
    from quantgate.config.rollout import RolloutPolicy, canary_shares, load_rollout
    from quantgate.config.suites import DeclaredSuite, declare_suite, declare_suites, suite_names
    from quantgate.config.targets import (
        ActivationNumerics,
        Catalog,
        Frozen,
        KVCache,
        Numerics,
        Recipe,
        RepairUpgrade,
        Target,
        WeightNumerics,
    )

__all__ = [
    "ActivationNumerics",
    "Catalog",
    "DeclaredSuite",
    "Floor",
    "Frozen",
    "Gates",
    "KVCache",
    "Numerics",
    "Recipe",
    "RepairUpgrade",
    "RolloutPolicy",
    "Target",
    "Tenant",
    "WeightNumerics",
    "cache_dir",
    "canary_shares",
    "check_target_names",
    "content_digest",
    "declare_suite",
    "declare_suites",
    "expanded",
    "file_digest",
    "load_gates",
    "load_model",
    "load_rollout",
    "overridden",
    "path_setting",
    "project_of",
    "project_root",
    "project_suites",
    "resolve_targets",
    "setting",
    "suite_names",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "ActivationNumerics": "targets",
        "Catalog": "targets",
        "content_digest": "identity",
        "file_digest": "identity",
        "Floor": "gates",
        "Frozen": "targets",
        "Gates": "gates",
        "KVCache": "targets",
        "DeclaredSuite": "suites",
        "Numerics": "targets",
        "Recipe": "targets",
        "RolloutPolicy": "rollout",
        "load_rollout": "rollout",
        "canary_shares": "rollout",
        "RepairUpgrade": "targets",
        "Target": "targets",
        "Tenant": "gates",
        "WeightNumerics": "targets",
        "check_target_names": "gates",
        "expanded": "environment",
        "load_gates": "gates",
        "load_model": "loader",
        "declare_suite": "suites",
        "declare_suites": "suites",
        "overridden": "environment",
        "path_setting": "environment",
        "project_of": "loader",
        "project_root": "paths",
        "cache_dir": "paths",
        "project_suites": "gates",
        "resolve_targets": "gates",
        "setting": "environment",
        "suite_names": "suites",
    },
)
