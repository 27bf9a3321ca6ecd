"""Quantize: one artifact per target from one source checkpoint.

``pipeline`` orders the work (preflight every recipe first, reuse by build key, build twins
once, install atomically); ``engines/`` holds one module per engine, found by name; ``preflight``
refuses a recipe that cannot apply to the model before anything is loaded.
"""
