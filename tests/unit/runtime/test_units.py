"""Byte units are SI: one convention for every size quantgate prints or reads."""

from __future__ import annotations

import pytest

from quantgate.runtime.units import GB, KB, MB, TB, format_bytes

pytestmark = pytest.mark.unit


def test_units_are_powers_of_1000():
    assert (KB, MB, GB, TB) == (10**3, 10**6, 10**9, 10**12)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1.0 kB"),
        (1024, "1.0 kB"),  # a KiB is not a unit here
        (999_949, "999.9 kB"),
        (166_800_000, "166.8 MB"),
        (3_100_000_000, "3.1 GB"),
        (2.5 * TB, "2.5 TB"),
        (-1500, "-1.5 kB"),
    ],
)
def test_format_bytes_picks_the_largest_si_unit_below_the_size(n, text):
    assert format_bytes(n) == text
