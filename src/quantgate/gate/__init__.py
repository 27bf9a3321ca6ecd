"""The gate: per (artifact, tenant), compare conservative confidence bounds with tenant floors.

- ``policy.py``: the ``tenants:`` part of gates.yaml, validated against the project's suites
  and targets.
- ``measures.py``: what each suite kind can measure from its per-item records, and which way
  is better.
- ``verdict.py``: the pure decision (bounds, exact comparisons, missing and uninformative rules).
- ``run.py``: reads an evaluation directory, decides, writes ``report.json``.
"""
