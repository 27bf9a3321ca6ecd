"""The embedded default model (``smollm2``): a source checkpoint that needs no model hub."""

from typing import TYPE_CHECKING

from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.embedded.smollm2 import MODEL_NAME, default_checkpoint

__all__ = [
    "MODEL_NAME",
    "default_checkpoint",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "MODEL_NAME": "smollm2",
        "default_checkpoint": "smollm2",
    },
)
