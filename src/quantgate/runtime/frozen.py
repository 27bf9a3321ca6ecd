"""The two bases of quantgate's pydantic models, so that one declaration says what every model is.

Both are immutable and strict (an unknown key is an error, so a typo in a config or a field a newer
writer added is refused, never dropped). ``Frozen`` is for what people write and what plans are
made of (configs, settings, plans): every float finite, since an ``inf`` floor or timeout passes
every comparison and cannot be written to JSON. ``FrozenRecord`` is for what the program measures
and records (manifests, results, reports), which reads back whatever was written.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Base of the validated data models (configs, settings, plans): unknown keys are errors,
    instances immutable, and every float finite."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class FrozenRecord(BaseModel):
    """Base of the records quantgate writes and reads back (manifests, results, reports, outcomes):
    unknown keys are errors and instances immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
