"""Oracles of the differential tests: paths that corral replaced, kept here to check the
package's own against them.

``transitions`` assembles per-agent transitions row by row from vector batches,
``buffers`` holds them and computes GAE row by row, and ``rows`` drives a vector
env through the transition assembler and trains MAPPO's policy from those rows
(the row path that the rollouts of :mod:`corral.data.rollouts` replaced).
"""
