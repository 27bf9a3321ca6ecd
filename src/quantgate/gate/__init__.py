"""The gate: per (artifact, tenant), compare conservative confidence bounds with tenant floors.

- ``verdict.py``: the pure decision (bounds, exact comparisons, power before verdict, missing,
  error and insufficient-evidence rules).
- ``baseline.py``: what each tenant is served today (the registry's approved versions, or
  ``--previous``), for before/after deltas and ``max_regression`` floors.
- ``run.py``: reads an evaluation directory, decides, writes ``report.json``.

What it reads comes from elsewhere: the floors from ``quantgate.config.gates``; each metric's
direction, statistic and per-item columns from the suite kind that owns it
(``quantgate.evaluate.suites``); the shape of ``report.json`` from ``quantgate.report_schema``.
No code here knows one suite kind from another.
"""
