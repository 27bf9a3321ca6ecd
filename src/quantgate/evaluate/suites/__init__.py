"""Evaluation suites: one YAML each under ``eval_suites/``, one module per suite kind.

A suite YAML names its ``kind``; the kind (a ``SuiteKind``) validates the YAML strictly, runs
the source once and scores models against it, and declares what the gate may measure on it
(``quantgate.declarations.metrics``), so that neither the evaluation runner nor the gate has code per kind. A
new kind is one file with ``@register("kind")``, or, from outside this package, a
``quantgate.suite_kinds`` entry point (``name = module:Class``) of an installed distribution; a
new suite of an existing kind (a tenant's domain suite) is a YAML and its data, no code.

What configuration knows of a kind (its spec model, metrics, tenant, item counts) is its
declaration (``quantgate.declarations``, below configuration), from which the kind's runner here
derives: gates.yaml is validated against the declarations, and configuration never imports
evaluation. The runners are found here (``KINDS``, by the same names), by the evaluation stage.
"""

from quantgate.config import suite_names
from quantgate.declarations import ENTRY_POINTS, PROFILES, SuiteSpec
from quantgate.evaluate.suites.kind import DECODE, EvalContext, SuiteKind, SuiteResult, register
from quantgate.evaluate.suites.loaded import KINDS, LoadedSuite, load_suite, load_suites

__all__ = [
    "DECODE",
    "ENTRY_POINTS",
    "KINDS",
    "PROFILES",
    "EvalContext",
    "LoadedSuite",
    "SuiteKind",
    "SuiteResult",
    "SuiteSpec",
    "load_suite",
    "load_suites",
    "register",
    "suite_names",
]
