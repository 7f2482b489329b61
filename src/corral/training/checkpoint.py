"""Checkpoint files and the global random generators a run must restore to resume.

A checkpoint is written with ``torch.save`` when the algorithm uses PyTorch
(so tensors load onto the CPU of a machine without the GPU they were on), and
with ``pickle`` otherwise. The runner never imports PyTorch itself: it uses
it only when the algorithm already has.
"""

from __future__ import annotations

import os
import pickle
import random
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from corral.errors import MissingDependencyError


def save(path: str | Path, checkpoint: dict[str, Any]) -> None:
    """Write ``checkpoint`` to ``path`` atomically (a killed run never leaves half a file)."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.save(checkpoint, partial)
    else:
        with open(partial, "wb") as file:
            pickle.dump(checkpoint, file, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(partial, path)


def load(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save`; tensors are loaded onto the CPU."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as file:
            return pickle.load(file)
    torch = sys.modules.get("torch")
    if torch is None:
        raise MissingDependencyError(
            f"{path} holds PyTorch tensors; load the algorithm first (pip install 'corral[torch]')"
        )
    return torch.load(path, map_location="cpu", weights_only=False)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and (when loaded) PyTorch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The state of the global generators, for :func:`set_rng_state`."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state()}
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (CUDA generators only where there are as many)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch = sys.modules.get("torch")
    if torch is not None and "torch" in state:
        torch.set_rng_state(state["torch"])
        cuda = state.get("torch_cuda")
        if (
            cuda is not None
            and torch.cuda.is_available()
            and torch.cuda.device_count() == len(cuda)
        ):
            torch.cuda.set_rng_state_all(cuda)
