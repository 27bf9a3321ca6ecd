"""Keep llm-compressor's log lines off stdout.

llm-compressor configures loguru at import to print INFO lines (one per quantized module) to
*stdout*, and logs a warning during the import itself. quantgate's stdout is part of its
contract (tables for people, paths for scripts), so engines call ``quiet()`` before using
llm-compressor: the import runs with its logging disabled, then one stderr sink at WARNING is
installed, and the custom METRIC level that GPTQ logs at is registered (the disabled
configuration skips it, and logging at an unknown level raises).
``LLM_COMPRESSOR_LOG_LEVEL`` still wins for someone debugging a recipe.
"""

from __future__ import annotations

import functools
import os
import sys


@functools.cache
def quiet() -> None:
    """Import llm-compressor with its logging off, then log its warnings to stderr (once per process)."""
    previous = os.environ.get("LLM_COMPRESSOR_LOG_DISABLED")
    os.environ["LLM_COMPRESSOR_LOG_DISABLED"] = "true"
    try:
        import llmcompressor  # noqa: F401  (configures loguru on import)
    finally:
        if previous is None:
            os.environ.pop("LLM_COMPRESSOR_LOG_DISABLED", None)
        else:
            os.environ["LLM_COMPRESSOR_LOG_DISABLED"] = previous
    from loguru import logger

    try:
        logger.level("METRIC")
    except ValueError:
        logger.level("METRIC", no=38)
    logger.remove()
    logger.enable("llmcompressor")
    logger.add(sys.stderr, level=os.environ.get("LLM_COMPRESSOR_LOG_LEVEL", "WARNING").upper())
