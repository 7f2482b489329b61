"""corral: one contract, fast vectorised sampling and correct learning for MARL envs."""

from typing import TYPE_CHECKING, Any

from corral.adapters import adapt
from corral.arrays import Place, device_path
from corral.batched_env import BatchedEnv, BatchedStep
from corral.checks import check_env
from corral.env import MultiAgentEnv, validate_actions
from corral.errors import (
    CheckpointError,
    ConfigError,
    CorralError,
    EnvContractError,
    EpisodeOverError,
    ExportError,
    GroupError,
    InvalidActionError,
    MissingDependencyError,
    RegistrationError,
    UnknownEnvError,
    UnsupportedEnvError,
)
from corral.export import to_gymnasium, to_pettingzoo
from corral.groups import group_agents
from corral.registry import batched_ids, make, register, register_namespace, registered_ids, spec
from corral.vector import Batch, VectorEnv, make_vec

if TYPE_CHECKING:
    from corral.algos.base import Algorithm
    from corral.training import Results


def train(algo: "str | type[Algorithm]", env: str | None = None, **settings: Any) -> "Results":
    """Train ``algo`` (``"mappo"``, ``"ippo"``, ``"maddpg"``, ``"dqn"``) on the env ``env``.

    ``settings`` are run settings (``total_steps``, ``num_envs``, ``seed``...,
    see :class:`corral.training.RunConfig`) and the algorithm's (``lr``...);
    ``resume=RUN_DIR`` continues a run. Returns :class:`corral.training.Results`.
    Needs ``pip install 'corral[train]'``.
    """
    from corral.training import train as train_run

    return train_run(algo, env, **settings)


__version__ = "0.1.0"

__all__ = [
    "Batch",
    "BatchedEnv",
    "BatchedStep",
    "CheckpointError",
    "ConfigError",
    "CorralError",
    "EnvContractError",
    "EpisodeOverError",
    "ExportError",
    "GroupError",
    "InvalidActionError",
    "MissingDependencyError",
    "MultiAgentEnv",
    "Place",
    "RegistrationError",
    "UnknownEnvError",
    "UnsupportedEnvError",
    "VectorEnv",
    "adapt",
    "batched_ids",
    "check_env",
    "device_path",
    "group_agents",
    "make",
    "make_vec",
    "register",
    "register_namespace",
    "registered_ids",
    "spec",
    "to_gymnasium",
    "to_pettingzoo",
    "train",
    "validate_actions",
]
