"""Where a batch's arrays live: numpy, or torch on a device.

Batched envs and the vector layer work on arrays of either namespace with the
operations both share (indexing with a bool mask, ``&``, ``|``, ``~``,
``.any``, ``.sum``); what differs (allocation, dtypes, moving to the host) is
here, once. ``array`` names the namespace (``"numpy"`` or ``"torch"``),
``device`` the torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``); numpy
arrays live on ``"cpu"``. ``host_views`` says how torch tensors on the CPU are
computed on; :func:`device_path` has the Places built inside it compute as on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from corral.arrays.tree import map_tree
from corral.errors import MissingDependencyError

Array = Any
"""A numpy array or a torch tensor (the arrays corral's batches and batched envs hold)."""

ARRAYS = ("numpy", "torch")

_HOST_VIEWS: ContextVar[bool] = ContextVar("corral_host_views", default=True)


def device_path() -> AbstractContextManager[None]:
    """Places built inside the block default to ``host_views=False``: torch on the CPU is
    computed on in torch, reading nothing back per step, as on a GPU (the tests run the
    device path so on a machine without one). What is built inside keeps that path after
    the block; an explicit ``Place(..., host_views=...)`` wins.

    Examples:
        >>> with device_path():
        ...     inside = Place("torch", "cpu")
        >>> inside.host_views, Place("torch", "cpu").host_views
        (False, True)
    """
    return host_views_by_default(False)


@contextmanager
def host_views_by_default(host_views: bool) -> Iterator[None]:
    """Places built inside the block default to ``host_views`` (:func:`device_path` is
    ``host_views_by_default(False)``)."""
    token = _HOST_VIEWS.set(host_views)
    try:
        yield
    finally:
        _HOST_VIEWS.reset(token)


def default_host_views() -> bool:
    """The ``host_views`` of a Place built here without one: ``False`` inside
    :func:`device_path`, else ``True``."""
    return _HOST_VIEWS.get()


def import_torch() -> Any:
    """The ``torch`` module, or a :class:`MissingDependencyError` saying how to install it."""
    try:
        import torch
    except ModuleNotFoundError as err:
        raise MissingDependencyError(
            "array='torch' needs PyTorch, which is not installed: pip install 'corral[train]' "
            "(or pip install torch)"
        ) from err
    return torch


@dataclass(frozen=True)
class Place:
    """A namespace and a device: where the arrays of a batch are allocated, and how they are
    computed on."""

    array: str = "numpy"
    device: str = "cpu"
    host_views: bool = field(default_factory=default_host_views, kw_only=True)
    """Whether torch tensors on the CPU are computed on through numpy views of their memory:
    the same values at numpy's cost per call (reading them costs nothing). ``False``: in
    torch, reading nothing back per step, as on a GPU. Meaningless for numpy and for other
    devices. Defaults to ``True``, ``False`` for a Place built inside :func:`device_path`."""

    def __post_init__(self) -> None:
        if self.array not in ARRAYS:
            raise ValueError(f"array must be one of {list(ARRAYS)}, got {self.array!r}")
        if not isinstance(self.host_views, bool):
            raise TypeError(f"host_views must be a bool, got {self.host_views!r}")
        if self.array == "numpy" and self.device != "cpu":
            raise ValueError(
                f"numpy arrays live on the CPU; device={self.device!r} needs array='torch'"
            )
        if self.array == "torch":
            torch = import_torch()
            device = torch.device(self.device)
            if device.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(f"device={self.device!r}, but torch sees no CUDA GPU here")

    @property
    def is_torch(self) -> bool:
        return self.array == "torch"

    @property
    def computes_on_host(self) -> bool:
        """Whether the vector layer computes on this place's arrays on the host (numpy, or
        torch on the CPU through numpy views, see :attr:`host_views`), reading values
        where it needs them; else in torch on the device, with no host read per step."""
        return not self.is_torch or (self.host_views and _on_cpu(self.device))

    def zeros(self, shape: tuple[int, ...], dtype: npt.DTypeLike) -> Any:
        """A zero array of ``shape`` and (numpy) ``dtype`` in this place."""
        if not self.is_torch:
            return np.zeros(shape, dtype)
        torch = import_torch()
        return torch.zeros(shape, dtype=torch_dtype(dtype), device=self.device)

    def asarray(self, value: Any, dtype: npt.DTypeLike | None = None) -> Any:
        """``value`` as an array of this place (no copy where it already is one)."""
        if not self.is_torch:
            return np.asarray(value, dtype)
        torch = import_torch()
        if isinstance(value, np.ndarray):
            # from_numpy shares the memory: it takes no negative stride nor read-only memory
            if not value.flags.writeable or any(stride < 0 for stride in value.strides):
                value = value.copy()
            value = torch.from_numpy(value)
        return torch.as_tensor(
            value, dtype=None if dtype is None else torch_dtype(dtype), device=self.device
        )

    def from_host(self, array: np.ndarray) -> Any:
        """A numpy array as this place's array: the same memory on the CPU, else a copy."""
        if not self.is_torch:
            return array
        torch = import_torch()
        return torch.from_numpy(array).to(self.device)


def _on_cpu(device: str) -> bool:
    return device == "cpu" or device.startswith("cpu:")


def on_host(place: Place, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Host (numpy) arrays, such as shared memory, as arrays of a CPU ``place``, sharing
    their memory."""
    if not place.is_torch:
        return arrays
    if place.device != "cpu":
        raise ValueError(f"arrays in host memory cannot live on device {place.device!r}")
    torch = import_torch()
    return {path: torch.from_numpy(a) for path, a in arrays.items()}


def torch_dtype(dtype: npt.DTypeLike) -> Any:
    """The torch dtype of a numpy dtype (``bool`` -> ``torch.bool``, ``float32``...)."""
    torch = import_torch()
    return torch.from_numpy(np.zeros(0, np.dtype(dtype))).dtype


def to_numpy(array: Any) -> np.ndarray:
    """Any array (numpy, or a torch tensor on any device) as a numpy array on the host."""
    if isinstance(array, np.ndarray):
        return array
    detach = getattr(array, "detach", None)
    if detach is not None:
        if array.is_cpu and not array.requires_grad:  # one torch call instead of three
            return array.numpy()
        return detach().cpu().numpy()
    return np.asarray(array)


def tree_to_numpy(value: Any) -> Any:
    """A nested value (dicts, tuples, lists) with its torch tensors as numpy arrays (views of
    CPU tensors); other leaves as they are."""
    if isinstance(value, (dict, tuple, list)):
        return map_tree(_leaf_to_numpy, value, lists=True)
    return to_numpy(value) if is_tensor(value) else value  # one array, without a call


def _leaf_to_numpy(value: Any) -> Any:
    return to_numpy(value) if is_tensor(value) else value


def is_tensor(array: Any) -> bool:
    """Whether ``array`` is a torch tensor (checked without importing torch)."""
    return type(array).__module__.startswith("torch")


def place_of(array: Any) -> Place:
    """The place an array lives in."""
    if isinstance(array, np.ndarray):
        return Place()
    device = getattr(array, "device", None)
    if device is not None and is_tensor(array):
        return Place("torch", str(device))
    return Place()
