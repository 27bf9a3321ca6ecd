"""Contracts: the records stages hand each other through files, one module per file kind.

``artifact``: an artifact directory and its ``manifest.json``; ``results``: an evaluation directory;
``report_schema``: ``report.json``, the gate's decision; ``serving_table``: which deployments can load
an artifact (carried by the manifest and the report). Above configuration (a manifest records a
target's numerics), below every stage, so every stage may read them. A library of public modules:
each is imported by its own path, ``from quantgate.contracts.artifact import Manifest``.
"""
