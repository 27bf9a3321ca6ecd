"""The gate: per (artifact, tenant), compare conservative confidence bounds with tenant floors.

- ``verdict.py``: the pure decision (bounds, exact comparisons, power before verdict, missing,
  error and insufficient-evidence rules).
- ``baseline.py``: what each tenant is served today (the registry's approved versions, or
  ``--previous``), for before/after deltas and ``max_regression`` floors.
- ``run.py``: reads an evaluation directory, decides, writes ``report.json``.

What it reads comes from elsewhere: the floors from ``quantgate.config.gates``; each metric's
direction, statistic and per-item columns from the suite kind that owns it
(``quantgate.evaluate.suites``); the shape of ``report.json`` from ``quantgate.contracts.report_schema``.
No code here knows one suite kind from another.
"""

from typing import TYPE_CHECKING

from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.gate.baseline import Baselines, from_registry, from_report_dir
    from quantgate.gate.floor import can_change_verdict, plan
    from quantgate.gate.run import gate_results, write_report_json
    from quantgate.gate.verdict import BLOCKING, evaluate_floor

__all__ = [
    "BLOCKING",
    "Baselines",
    "can_change_verdict",
    "evaluate_floor",
    "from_registry",
    "from_report_dir",
    "gate_results",
    "plan",
    "write_report_json",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "BLOCKING": "verdict",
        "Baselines": "baseline",
        "can_change_verdict": "floor",
        "evaluate_floor": "verdict",
        "from_registry": "baseline",
        "from_report_dir": "baseline",
        "gate_results": "run",
        "plan": "floor",
        "write_report_json": "run",
    },
)
