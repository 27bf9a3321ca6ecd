"""Keep llm-compressor's log lines off stdout.

llm-compressor configures loguru at import to print INFO lines (one per quantized module) to
*stdout*. quantgate's stdout is part of its contract (``quantgate pull`` prints a path there
for scripts to read), so engines call ``quiet()`` after importing llm-compressor: warnings and
errors still reach stderr, per-module chatter does not. ``LLM_COMPRESSOR_LOG_LEVEL`` still
wins for someone debugging a recipe.
"""

from __future__ import annotations

import functools
import os
import sys


@functools.cache
def quiet() -> None:
    import llmcompressor  # noqa: F401  (configures loguru on import)
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level=os.environ.get("LLM_COMPRESSOR_LOG_LEVEL", "WARNING").upper())
