"""Evaluation suites: run the source and each artifact on the same inputs and score them."""

from typing import TYPE_CHECKING

from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.evaluate.data import DataDir, require_available, sources
    from quantgate.evaluate.environment import switches as numerics_switches
    from quantgate.evaluate.merge import merge_evaluations
    from quantgate.evaluate.runner import EvalRun, evaluate
    from quantgate.evaluate.sequential import DEFAULT
    from quantgate.evaluate.suites import KINDS, PROFILES, EvalContext, LoadedSuite, SuiteKind, load_suites

__all__ = [
    "DEFAULT",
    "KINDS",
    "PROFILES",
    "DataDir",
    "EvalContext",
    "EvalRun",
    "LoadedSuite",
    "SuiteKind",
    "evaluate",
    "load_suites",
    "merge_evaluations",
    "numerics_switches",
    "require_available",
    "sources",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "EvalRun": "runner",
        "numerics_switches": "environment:switches",
        "DEFAULT": "sequential",
        "DataDir": "data",
        "EvalContext": "suites",
        "KINDS": "suites",
        "LoadedSuite": "suites",
        "PROFILES": "suites",
        "SuiteKind": "suites",
        "evaluate": "runner",
        "load_suites": "suites",
        "merge_evaluations": "merge",
        "require_available": "data",
        "sources": "data",
    },
)
