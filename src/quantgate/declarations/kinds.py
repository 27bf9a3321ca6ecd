"""The registry of suite kinds' declarations (``SUITE_KINDS``): quantgate's own, found by their
``@declare("kind")`` in ``quantgate.declarations.suite_kinds`` and imported on first use, then an
installed distribution's ``quantgate.suite_kinds`` entry points (whose class is the kind's
declaration and runner in one). Apart from ``suites``, which the kinds import, so that the
registry imports them and they never import it.
"""

from __future__ import annotations

from quantgate.declarations.suites import SuiteDeclaration
from quantgate.runtime.extensions import PluginRegistry

ENTRY_POINTS = "quantgate.suite_kinds"

SUITE_KINDS: PluginRegistry[type[SuiteDeclaration]] = PluginRegistry(
    "suite kind",
    ENTRY_POINTS,
    "quantgate.declarations.suite_kinds",
    "declare",
    "quantgate.declarations.suites:SuiteDeclaration",
)
