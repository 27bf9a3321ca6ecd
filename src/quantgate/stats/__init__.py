"""The gate's statistics, below every stage: confidence bounds per kind of per-item statistic
(``bounds``), chosen and calibrated by measurement (bench/gate_calibration.py), and always-valid
bounds for sequential evaluation (``sequence``: a betting confidence sequence). numpy and scipy
only, so that evaluation (which skips what cannot change a verdict) and the gate share one account
of what a floor's items can show. A library of public modules: ``from quantgate.stats import
sequence`` is how the gate and evaluation use it."""

from quantgate.stats.bounds import (
    MIN_ITEMS,
    N_RESAMPLES,
    Interval,
    calibrated,
    exceedance,
    proportion,
    quantile,
    ratio,
    resample_counts,
    zero_event_bound,
)

__all__ = [
    "MIN_ITEMS",
    "N_RESAMPLES",
    "Interval",
    "calibrated",
    "exceedance",
    "proportion",
    "quantile",
    "ratio",
    "resample_counts",
    "zero_event_bound",
]
