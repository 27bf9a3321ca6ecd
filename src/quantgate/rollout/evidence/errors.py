"""The evidence readers' errors: a source that cannot be reached may be retried (exit 75); a
series or endpoint that answers wrongly is a setting to fix (exit 2), named with the fix."""

from __future__ import annotations

from quantgate.runtime.errors import InputError, TransientError


class EvidenceUnavailableError(TransientError):
    """Prometheus, the store or a serving endpoint did not answer: retry later (exit 75)."""

    def __init__(self, where: str, problem: str, fix: str) -> None:
        self.path, self.problem, self.fix = where, problem, fix
        super().__init__(f"{where}: {problem}. Fix: {fix}")


class MissingSeriesError(InputError):
    """A metric or label the settings name has no series: the setting is wrong, or the engine
    does not export it (exit 2)."""


class EvidenceFormatError(InputError):
    """A source answered with something that is not what its contract says (exit 2)."""
