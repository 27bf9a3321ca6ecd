"""Checkpoint intake: the boundary where a source checkpoint is validated, hashed and classified.

``intake(path, policy)`` returns a ``SourceRecord`` or raises a ``CheckpointError`` subclass
naming the file, the problem and the fix; ``confirm(record)`` checks that the checkpoint still
holds the files an earlier intake recorded (what a run's later steps do instead of intake).
Modules, in the order intake uses them: ``tree`` (directory entries: symlinks, pickles, code,
names; content hash), ``bounded_json`` (every JSON file read within size, depth and integer
bounds, every number finite), ``architecture`` (config.json, remote code, shapes against a
meta-device skeleton), ``chat_template`` (templates parsed and rendered in transformers' sandbox,
in a child under CPU and memory limits: ``bounded_child``), ``weights`` (the one file set, a shard
index naming every tensor, tensor inventory, source dtypes, NaN/Inf scan), ``safetensors_header``
(strict header reader), ``bounds`` (config counts bounded by the tensors present, before any
model is built), ``tokenizer_files`` (tokenizer files bounded and loaded in a bounded child, their
regexes probed by ``regex_probes``, every token id a row of the embedding), ``completeness``
(every declared tensor present, nothing extra), ``record`` (the stat cache is ``quantgate.runtime.stat_cache``).
"""

from typing import TYPE_CHECKING

from quantgate.intake.checkpoint import confirm, intake
from quantgate.intake.record import SourceRecord
from quantgate.intake.safetensors_header import SafetensorsHeader, TensorInfo, read_header
from quantgate.runtime.exports import lazy_exports
from quantgate.runtime.hashing import FileEntry

if TYPE_CHECKING:
    from quantgate.intake.weights import model_files

__all__ = [
    "FileEntry",
    "SafetensorsHeader",
    "SourceRecord",
    "TensorInfo",
    "confirm",
    "intake",
    "model_files",
    "read_header",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "model_files": "weights",
    },
)
