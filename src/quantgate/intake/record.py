"""The intake record: what every later stage knows about the source checkpoint.

It is a result, not a config: built once by ``intake`` from a checkpoint that passed every
check, immutable afterwards, and keyed by ``content_hash`` so that builds and evaluations
can be cached per source content rather than per path (the same checkpoint copied
elsewhere hashes the same; one changed byte in any file hashes differently). ``weight_files`` is
the one file set of the checkpoint: engines read those files and no other weight file.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, NonNegativeInt

from quantgate.runtime.frozen import FrozenRecord
from quantgate.runtime.hashing import FileEntry


class SourceRecord(FrozenRecord):
    """A validated, hashed, classified source checkpoint."""

    path: str = Field(description="absolute path of the checkpoint directory at intake")
    content_hash: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 over the sorted (relative path, file digest) pairs of every file "
        "(hashing.content_hash; each digest in its entry's scheme)",
    )
    files: dict[str, FileEntry] = Field(description="relative POSIX path -> content of every file")
    weight_files: list[str] = Field(
        min_length=1,
        description="the model's safetensors files (the index's shards, or model.safetensors): the "
        "files intake validated and scanned, and the only weight files an engine may read",
    )
    architecture: str = Field(description="config.architectures[0], e.g. LlamaForCausalLM")
    model_type: str
    params: NonNegativeInt = Field(description="parameters counted from the safetensors headers")
    moe: bool
    num_experts: int | None = Field(None, description="routed experts per MoE layer; None when dense")
    dtype: str = Field(description="dominant floating dtype by bytes, torch-style (e.g. bfloat16)")
    bytes: NonNegativeInt = Field(description="total size of all files")
    context_length: int | None = Field(None, description="max_position_embeddings, when the config has it")
    model_class: str = Field(description="the model class in gates.yaml this checkpoint falls in")
    tie_word_embeddings: bool

    @property
    def model_name(self) -> str:
        """The name this checkpoint is registered under: its directory's name, without the cache tag
        quantgate gives the embedded default (``smollm2-135m-instruct-<hash>-v3`` ->
        ``smollm2-135m-instruct``)."""
        from quantgate.embedded import MODEL_NAME

        name = Path(self.path).name
        return MODEL_NAME if name.startswith(MODEL_NAME) else name
