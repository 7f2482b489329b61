"""numpy's own reductions as mpe2 calls them, replicated over arrays of every copy.

mpe2 computes some distances with ``np.linalg.norm`` and some means with ``np.mean``,
whose floating-point operations are not the plain formula: the norm's squared sum is a
BLAS dot product (fused multiply-adds where the CPU has them), and the mean adds in
numpy's pairwise order. These functions give the same bits in numpy float64 (torch
arrays get the plain formulas, within rounding of them).
"""

from __future__ import annotations

import numpy as np

from corral.batched_env import Array

# numpy's pairwise summation adds up to this many values with eight accumulators.
_PAIRWISE_BLOCK = 128
_ACCUMULATORS = 8


def norm(delta: Array) -> Array:
    """``np.linalg.norm`` of each 2-vector along the last axis of ``delta``."""
    if isinstance(delta, np.ndarray):
        # A stack of 1x2 by 2x1 products: each one the BLAS dot that np.linalg.norm calls.
        rows = np.ascontiguousarray(delta)[..., None, :]
        return np.sqrt(np.matmul(rows, rows.swapaxes(-1, -2))[..., 0, 0])
    return (delta[..., 0] * delta[..., 0] + delta[..., 1] * delta[..., 1]).sqrt()


def mean(values: Array) -> Array:
    """``np.mean`` along the last axis (at most 128 values), added in numpy's order."""
    n = values.shape[-1]
    if n > _PAIRWISE_BLOCK:
        raise ValueError(f"mean adds at most {_PAIRWISE_BLOCK} values in numpy's order, got {n}")
    if n < _ACCUMULATORS:
        total = values[..., 0]
        for k in range(1, n):
            total = total + values[..., k]
        return total / n
    # Eight running sums over whole blocks of eight, combined as a tree, then the rest.
    whole = n - n % _ACCUMULATORS
    r = [values[..., k] for k in range(_ACCUMULATORS)]
    for start in range(_ACCUMULATORS, whole, _ACCUMULATORS):
        r = [r[k] + values[..., start + k] for k in range(_ACCUMULATORS)]
    total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for k in range(whole, n):
        total = total + values[..., k]
    return total / n
