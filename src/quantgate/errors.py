"""The typed error hierarchy.

Every refusal quantgate makes is its own class, so callers (the CLI, Prefect flows, tests)
match on types rather than on message strings. Each error names the file it is about, the
problem, and the fix, because the person reading it is usually a release engineer looking at
a CI log, not the author of the code.

Exit codes follow the command-line contract: 2 for bad input or usage, 1 for a required
artifact that failed (its build or its gate).
"""

from __future__ import annotations

from pathlib import Path


class QuantgateError(Exception):
    """Base of every error quantgate raises on purpose."""

    exit_code = 1


class InputError(QuantgateError):
    """Bad input or usage: exit code 2, and nothing is written."""

    exit_code = 2

    def __init__(self, path: str | Path | None, problem: str, fix: str) -> None:
        self.path = str(path) if path is not None else None
        self.problem = problem
        self.fix = fix
        where = f"{self.path}: " if self.path else ""
        super().__init__(f"{where}{problem}. Fix: {fix}")


class ConfigFileError(InputError):
    """A YAML config (target, recipe, gates, calibration spec) is malformed."""


class UsageError(InputError):
    """A command-line option names something that does not exist."""


class CheckpointError(InputError):
    """A source checkpoint failed intake."""


class EmptyCheckpointError(CheckpointError):
    pass


class PickleFileError(CheckpointError):
    pass


class RemoteCodeError(CheckpointError):
    pass


class CheckpointConfigError(CheckpointError):
    pass


class CorruptSafetensorsError(CheckpointError):
    pass


class NonFiniteWeightsError(CheckpointError):
    pass


class ShapeMismatchError(CheckpointError):
    pass


class MissingShardError(CheckpointError):
    pass


class SymlinkEscapeError(CheckpointError):
    pass


class CalibrationError(InputError):
    """A traffic log or calibration spec cannot produce the declared set."""


class RecipeIncompatibleError(InputError):
    """A recipe cannot be applied to this model as written (e.g. group size)."""


class BuildError(QuantgateError):
    """A target failed to build for a reason that is not the input's fault."""


class MissingDependencyError(InputError):
    """An optional piece (CUDA, modelopt, the embedded model wheel) is not installed."""
