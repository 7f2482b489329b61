"""mpe2's partial observability as arrays: each agent sees its ``count`` nearest entities.

mpe2 (``_mpe_utils/partial_observability.py``) sorts the entities an agent may
see by their distance to it, keeps the ``count`` closest (closest first) and
pads with zeros up to ``count`` slots, so that an observation keeps its size.
"""

from __future__ import annotations

from corral.arrays import Ops
from corral.batched_env import Array


def nearest(ops: Ops, relative: Array, count: int) -> tuple[Array, Array]:
    """The ``count`` nearest of ``relative`` ``[E, agent, k, 2]`` (each entity's position
    relative to the agent) per agent, closest first and zero-padded to ``count``, and the
    indices chosen ``[E, agent, min(k, count)]`` (for :func:`pick`)."""
    x, y = relative[..., 0], relative[..., 1]
    order = ops.argsort(ops.sqrt(x * x + y * y), 2)[..., :count]
    return pick(ops, relative, order, count), order


def pick(ops: Ops, values: Array, order: Array, count: int) -> Array:
    """``values`` ``[E, agent, k, d]`` at ``order`` ``[E, agent, c]`` along ``k``,
    zero-padded to ``count`` slots."""
    e, n, k, d = values.shape
    c = order.shape[2]
    # One take from every copy's and agent's entities, laid end to end: (copy, agent) row
    # r's start at r * k.
    rows = ops.arange(e * n, order).reshape(e, n, 1) * k
    flat = (order + rows).reshape(-1)
    chosen = ops.take(values.reshape(1, e * n * k, d), flat, 1).reshape(e, n, c, d)
    if count > c:
        pad = ops.zeros((e, n, count - c, d), chosen)
        chosen = ops.concat([chosen, pad], 2)
    return chosen


def flat(entities: Array) -> Array:
    """``[E, agent, k, d]`` (``k`` entities seen by each agent) as ``[E, agent, k * d]``,
    their slots in an observation."""
    e, n, k, d = entities.shape
    return entities.reshape(e, n, k * d)
