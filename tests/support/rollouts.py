"""Comparing rollouts field by field."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from corral.arrays.tree import map_tree
from corral.data.rollouts import Rollout


def assert_rollouts_equal(got: Rollout, want: Rollout, where: str) -> None:
    """Every field of ``got`` equals ``want``'s (extras and next observations by key);
    ``where`` names the rollout in the failure."""
    for f in fields(Rollout):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if f.name in ("extras", "next"):
            assert a.keys() == b.keys(), f"{where}.{f.name}"
            for key in a:
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"{where}.{f.name}.{key}")
        elif b is None:
            assert a is None, f"{where}.{f.name}"
        else:
            map_tree(lambda x, y, n=f.name: np.testing.assert_array_equal(x, y, err_msg=n), a, b)
