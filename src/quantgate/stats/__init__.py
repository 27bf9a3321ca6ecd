"""The gate's statistics, below every stage, numpy and scipy only, so that evaluation (which skips
what cannot change a verdict and stops a suite once its floors are decided) and the gate share one
account of what a floor's items can show.

- ``bounds``: exact (Clopper-Pearson) bounds for rates of events.
- ``betting``: the test every mean is decided by, valid for every distribution on [0, 1].
- ``linear``: a floor as a mean of per-item values within its stated class.
- ``forms``: each floor kind in that form, from a metric's declaration and the source's records.
- ``sequence``: the same test looked at after every batch (sequential evaluation).

``from quantgate.stats import sequence`` is how the gate and evaluation use it.
"""

from quantgate.stats.bounds import Interval, proportion, zero_event_bound
from quantgate.stats.linear import ItemRange

__all__ = ["Interval", "ItemRange", "proportion", "zero_event_bound"]
