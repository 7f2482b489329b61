"""Training runs: config, runner, metrics, checkpoints, evaluation GIFs and learning curves.

``corral.train(algo, env=..., **settings)`` is the short way in; see
:mod:`corral.training.runner` for what a run writes and how it resumes.
Nothing here imports PyTorch: only the algorithm a run uses does.
"""

from corral.training.config import ConfigError, RunConfig, TrainConfig, load_config
from corral.training.runner import Evaluation, Results, Runner, load_run, train

__all__ = [
    "ConfigError",
    "Evaluation",
    "Results",
    "RunConfig",
    "Runner",
    "TrainConfig",
    "load_config",
    "load_run",
    "train",
]
