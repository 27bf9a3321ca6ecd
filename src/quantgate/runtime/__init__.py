"""Runtime helpers: what every layer needs and no stage owns, at the bottom of the house.

Failures and exit codes (``errors``), atomic writes (``atomic``), bounded JSON reads (``bounded_json``),
file hashes (``hashing``, ``stat_cache``), frozen records (``frozen``), safe relative paths
(``safe_path``), sizes (``units``), names and suggestions (``registry``, ``suggest``), the plugin
registries of the extension points (``extensions``), lazy package exports (``exports``), console
output (``escape``, ``progress``), and where computation runs (``devices``, ``memory``, ``offload``,
``sharding``, ``greedy``, ``step_parent``). It imports nothing of quantgate outside itself. A library
of public modules: each is imported by its own path, ``from quantgate.runtime.atomic import write_json``.
"""
