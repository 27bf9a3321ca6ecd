"""Keep llm-compressor's log lines off stdout.

llm-compressor configures loguru at import to print INFO lines (one per quantized module) to
*stdout*, some of them during the import itself. quantgate's stdout is part of its contract
(tables for people, paths for scripts), so engines call ``quiet()`` before touching
llm-compressor: the import runs with its logging disabled, then one stderr sink at WARNING is
installed. ``LLM_COMPRESSOR_LOG_LEVEL`` still wins for someone debugging a recipe.
"""

from __future__ import annotations

import functools
import os
import sys


@functools.cache
def quiet() -> None:
    previous = os.environ.get("LLM_COMPRESSOR_LOG_DISABLED")
    os.environ["LLM_COMPRESSOR_LOG_DISABLED"] = "true"
    try:
        import llmcompressor  # noqa: F401  (configures loguru on import)
    finally:
        if previous is None:
            os.environ.pop("LLM_COMPRESSOR_LOG_DISABLED")
        else:
            os.environ["LLM_COMPRESSOR_LOG_DISABLED"] = previous
    from loguru import logger

    logger.remove()
    logger.enable("llmcompressor")
    logger.add(sys.stderr, level=os.environ.get("LLM_COMPRESSOR_LOG_LEVEL", "WARNING").upper())
