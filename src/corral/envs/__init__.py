"""corral's built-in envs, pure NumPy, each registered when its module is imported.

* ``corral/rps`` (:mod:`corral.envs.rps`): turn-based rock-paper-scissors.
* ``corral/rps4`` (:mod:`corral.envs.rps4`): four players, two pairs on different clocks.
* ``corral/memory`` (:mod:`corral.envs.memory`): a cue to remember; only memory solves it
  (``corral/memory-turns``: the agents take turns).
* ``corral/tag`` (:mod:`corral.envs.tag`): grid predator-prey; prey die mid-episode.
* ``mdp/...`` (:mod:`corral.envs.mdp`): small MDPs and matrix games with known optima.
"""
