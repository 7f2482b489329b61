"""PyTorch's CPU threads in a run's process: the ``torch_threads`` setting.

torch uses one thread per core by default. corral's networks are small, so
extra threads gain little, and every op stalls while another process (an
env worker, another run) holds one of those cores: training then runs several
times slower than with one thread (benchmarks/JOURNAL.md, "Torch threads").
Inter-op threads are left as they are: the algorithms run no inter-op
parallel work.
"""

from __future__ import annotations

import os
import sys


def torch_threads(setting: int | str) -> int:
    """The thread count of a ``torch_threads`` setting.

    ``"auto"`` is ``OMP_NUM_THREADS`` when that is set to a count, else 1.

    Examples:
        >>> torch_threads(4)
        4
    """
    if setting != "auto":
        return int(setting)
    count = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(count) if count.isdigit() and int(count) > 0 else 1


def set_torch_threads(count: int) -> int | None:
    """Set torch's CPU threads to ``count`` if torch is loaded; return the count before
    (``None``, doing nothing, when torch is not loaded: the run does not use it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    before = torch.get_num_threads()
    if count != before:
        torch.set_num_threads(count)
    return before
