"""Validated configuration: targets and recipes (``targets``), gates.yaml (``gates``), and the
YAML loader whose errors name ``file:line`` and the nearest valid key (``loader``).

Config is immutable data checked once at the boundary, so a typo fails before any build.
"""
