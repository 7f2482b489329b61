"""One block of memory, shared by a process and its workers, that holds every batch array.

The block is anonymous: it never has a name in the file system (a Linux
``memfd``; elsewhere a temporary file unlinked as soon as it is opened), so no
segment can outlive the processes that map it, whatever happens to them, and
no resource tracker is involved. Processes share it by passing its file
descriptor. Each array starts at an aligned offset; the first axis of every
array is the env, so a worker maps the rows of its own envs.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

ALIGN = 64  # bytes; a cache line, and enough for every numpy dtype

Specs = Mapping[str, tuple[tuple[int, ...], np.dtype]]


@dataclass(frozen=True)
class BlockLayout:
    """Shape, dtype and byte offset of every array in a block of ``size`` bytes."""

    specs: dict[str, tuple[tuple[int, ...], np.dtype]]
    offsets: dict[str, int]
    size: int

    @classmethod
    def of(cls, specs: Specs) -> BlockLayout:
        offsets, size = {}, 0
        for path, (shape, dtype) in specs.items():
            offsets[path] = size
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            size += -(-nbytes // ALIGN) * ALIGN
        return cls(dict(specs), offsets, max(size, ALIGN))


def create_block(size: int) -> int:
    """The file descriptor of ``size`` zeroed bytes of anonymous shared memory."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("corral-batch")
    else:
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix="corral-batch-", dir=directory)
        os.unlink(path)
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd


def map_arrays(fd: int, layout: BlockLayout, rows: slice = slice(None)) -> dict[str, np.ndarray]:
    """Views of ``rows`` (along the env axis) of every array in the block behind ``fd``.

    The mapping lives as long as any of the views; ``fd`` may be closed at once.
    """
    buffer = mmap.mmap(fd, layout.size)
    return {
        path: np.ndarray(shape, dtype, buffer=buffer, offset=layout.offsets[path])[rows]
        for path, (shape, dtype) in layout.specs.items()
    }
