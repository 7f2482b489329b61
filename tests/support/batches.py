"""Where batches live (array kind and device), and two batches compared field by field."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import corral
from corral.arrays import to_numpy

from .marks import needs_cuda, needs_torch

PLACES = [
    ("numpy", "cpu"),
    pytest.param("torch", "cpu", marks=needs_torch),
    pytest.param("torch", "cuda", marks=needs_cuda),
]


def _leaves(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}/{k}")
    elif isinstance(value, (tuple, list)):
        for k, v in enumerate(value):
            yield from _leaves(v, f"{path}/{k}")
    elif value is not None:
        yield path, value


def assert_batches_equal(
    want: corral.Batch, got: corral.Batch, where: str, rtol: float = 0.0
) -> None:
    """Every field of two batches equal, value and dtype (``got`` may hold tensors), or
    within ``rtol`` (and as much absolute, for values near zero)."""
    for field in dataclasses.fields(want):
        a = dict(_leaves(getattr(want, field.name)))
        b = dict(_leaves(getattr(got, field.name)))
        assert a.keys() == b.keys(), f"{where}: {field.name} keys"
        for path, x in a.items():
            y = to_numpy(b[path])
            assert x.dtype == y.dtype, f"{where}: {field.name}{path} dtype {x.dtype} {y.dtype}"
            if rtol and x.dtype.kind == "f":
                np.testing.assert_allclose(
                    y, x, rtol=rtol, atol=rtol, err_msg=f"{where}: {field.name}{path}"
                )
            else:
                np.testing.assert_array_equal(x, y, err_msg=f"{where}: {field.name}{path}")
