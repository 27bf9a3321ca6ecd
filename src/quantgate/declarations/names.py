"""The names a recipe and a target may use for a build engine or a numerics format, known below
configuration: quantgate's own, written here, and an installed plugin's, read from its
distribution's entry points (nothing imported). The stages hold the registries of what the names
run (``quantgate.quantize.engines``, ``quantgate.numerics``); tests/unit/runtime/test_extensions.py
checks that each lists exactly the names declared here, so a new built-in engine or format is its
module and one name here.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points

from quantgate.runtime.extensions import installed, load_plugin


@dataclass(frozen=True)
class Declared:
    """One extension point's names: ``builtin`` and the entry points of ``group``."""

    what: str
    group: str
    builtin: tuple[str, ...]

    def names(self) -> list[str]:
        """Built-in names and installed entry points' names, sorted."""
        return sorted({*self.builtin, *(ep.name for ep in entry_points(group=self.group))})

    def load_plugins(self) -> None:
        """Load every installed plugin of this extension point under the guard
        (``extensions.load_plugin``); a built-in name always wins, and its plugin is never loaded."""
        for name, plugin in installed(self.what, self.group).items():
            if name not in self.builtin:
                load_plugin(plugin)


ENGINES = Declared(
    "engine",
    "quantgate.engines",
    ("llmcompressor.model_free", "llmcompressor.oneshot", "modelopt", "quantgate.stream_fp8"),
)
WEIGHT_FORMATS = Declared(
    "weight format", "quantgate.weight_formats", ("fp8_e4m3fn", "fp8_e4m3fnuz", "int4", "nvfp4")
)
ACTIVATION_FORMATS = Declared(
    "activation format",
    "quantgate.activation_formats",
    ("fp8_e4m3fn_per_token", "fp8_e4m3fnuz_per_token", "nvfp4_calibrated"),
)
KV_CACHE_FORMATS = Declared("KV cache format", "quantgate.kv_cache_formats", ("fp8_e4m3fn", "fp8_e4m3fnuz"))
