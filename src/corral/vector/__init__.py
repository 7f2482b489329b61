"""The vector layer: many envs as one batch of arrays per agent group."""

from corral.vector.layout import Layout
from corral.vector.vector_env import Batch, VectorEnv, make_vec

__all__ = ["Batch", "Layout", "VectorEnv", "make_vec"]
