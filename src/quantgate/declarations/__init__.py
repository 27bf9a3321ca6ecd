"""Declarations: what configuration needs to know of each extension point (a suite kind, a build
engine, a numerics format) without importing the stage that runs it. Below configuration, above
the shared helpers; the stages' runners and formats derive from or are checked against these.

``suites``: the suite spec model and ``SuiteDeclaration``; ``kinds``: their registry (``SUITE_KINDS``);
``suite_kinds``: one module per built-in kind; ``names``: the built-in engine and format names.
"""

from typing import TYPE_CHECKING

from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.declarations.kinds import ENTRY_POINTS, SUITE_KINDS
    from quantgate.declarations.names import ACTIVATION_FORMATS, ENGINES, KV_CACHE_FORMATS, WEIGHT_FORMATS
    from quantgate.declarations.suites import (
        PROFILES,
        DataSource,
        SuiteDeclaration,
        SuiteSpec,
        declare,
    )

__all__ = [
    "ACTIVATION_FORMATS",
    "ENGINES",
    "ENTRY_POINTS",
    "KV_CACHE_FORMATS",
    "PROFILES",
    "SUITE_KINDS",
    "WEIGHT_FORMATS",
    "DataSource",
    "SuiteDeclaration",
    "SuiteSpec",
    "declare",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "ACTIVATION_FORMATS": "names",
        "ENGINES": "names",
        "KV_CACHE_FORMATS": "names",
        "WEIGHT_FORMATS": "names",
        "ENTRY_POINTS": "kinds",
        "PROFILES": "suites",
        "SUITE_KINDS": "kinds",
        "DataSource": "suites",
        "SuiteDeclaration": "suites",
        "SuiteSpec": "suites",
        "declare": "suites",
    },
)
