"""corral's array layer: where a batch's arrays live (numpy, or torch on a device), the
op set that computes on either, and numpy's per-copy random streams as arrays of either."""

from corral.arrays.ops import Ops, TorchOps, ops_for, ops_in, ops_of, xp, zeros
from corral.arrays.place import (
    Array,
    Place,
    default_host_views,
    device_path,
    host_views_by_default,
    import_torch,
    is_tensor,
    on_host,
    place_of,
    to_numpy,
    torch_dtype,
    tree_to_numpy,
)
from corral.arrays.streams import CopyStreams

__all__ = [
    "Array",
    "CopyStreams",
    "Ops",
    "Place",
    "TorchOps",
    "default_host_views",
    "device_path",
    "host_views_by_default",
    "import_torch",
    "is_tensor",
    "on_host",
    "ops_for",
    "ops_in",
    "ops_of",
    "place_of",
    "to_numpy",
    "torch_dtype",
    "tree_to_numpy",
    "xp",
    "zeros",
]
