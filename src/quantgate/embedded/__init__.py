"""The embedded default model (``smollm2``): a source checkpoint that needs no model hub."""
