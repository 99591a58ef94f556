"""Comparing weight files exactly (for the resume and multi-worker tests)."""

from __future__ import annotations

import numpy as np


def read_weights(path) -> dict:
    """Every dataset of an HDF5 weights file, by its path inside the file."""
    import h5py

    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return out


def assert_same_weights(a, b) -> None:
    """The two files hold the same, non-empty set of arrays, bit for bit."""
    wa, wb = read_weights(a), read_weights(b)
    assert wa.keys() == wb.keys() and wa
    for key in wa:
        np.testing.assert_array_equal(wa[key], wb[key], err_msg=key)
