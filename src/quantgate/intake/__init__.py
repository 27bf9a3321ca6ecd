"""Checkpoint intake: the boundary where a source checkpoint is validated, hashed and classified.

``intake(path, policy)`` returns a ``SourceRecord`` or raises a ``CheckpointError`` subclass
naming the file, the problem and the fix. Modules, in the order intake uses them:
``tree`` (directory entries: symlinks, pickles, code; content hash), ``architecture``
(config.json, remote code, shapes against a meta-device skeleton), ``safetensors_header``
(strict header reader), ``weights`` (shard index, tensor inventory, NaN/Inf scan), ``record``.
"""

from quantgate.hashing import FileEntry
from quantgate.intake.checkpoint import intake
from quantgate.intake.record import SourceRecord
from quantgate.intake.safetensors_header import SafetensorsHeader, TensorInfo, read_header

__all__ = ["FileEntry", "SafetensorsHeader", "SourceRecord", "TensorInfo", "intake", "read_header"]
