"""The embedded default model (``smollm2``): a source checkpoint that needs no model hub."""

from typing import TYPE_CHECKING

from quantgate.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.embedded.smollm2 import default_checkpoint, model_name

__all__ = [
    "default_checkpoint",
    "model_name",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "default_checkpoint": "smollm2",
        "model_name": "smollm2",
    },
)
