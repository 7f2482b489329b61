"""Where the learner's batches live, and its host reads of tensors counted."""

from __future__ import annotations

import pytest

from . import host_reads
from .marks import needs_cuda

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=needs_cuda,
    ),
]

NOT_COUNTED = ("corral.vector.", "corral.envs.")
"""Callers whose reads are not the learner's: the vector layer and the envs."""

HOST_SIDE = ("torch.optim.",)
"""Reads of values kept on the host whatever the device: a non-fused optimiser's step
counts (CPU tensors beside CUDA parameters, read without a device synchronisation)."""


def counting_reads():
    """Count host reads of tensors (:func:`host_reads.counting_reads`) by the learning side:
    callers outside :data:`NOT_COUNTED`."""
    return host_reads.counting_reads(skip=NOT_COUNTED, host_side=HOST_SIDE)
