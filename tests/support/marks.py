"""The skip marks of tests that need torch or a CUDA GPU: one place, so that the suite skips
the same way everywhere on a machine without them."""

from __future__ import annotations

import importlib.util

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None


def _cuda() -> bool:
    if not HAS_TORCH:
        return False
    import torch

    return torch.cuda.is_available()


HAS_CUDA = _cuda()
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU here")
