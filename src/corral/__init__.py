"""corral: one contract, fast vectorised sampling and correct learning for MARL envs."""

from corral.adapters import adapt
from corral.checker import check_env
from corral.env import MultiAgentEnv, validate_actions
from corral.errors import (
    CorralError,
    EnvContractError,
    EpisodeOverError,
    GroupError,
    InvalidActionError,
    MissingDependencyError,
    RegistrationError,
    UnknownEnvError,
)
from corral.groups import group_agents
from corral.registry import make, register, register_namespace, registered_ids, spec
from corral.vector import Batch, VectorEnv, make_vec

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "CorralError",
    "EnvContractError",
    "EpisodeOverError",
    "GroupError",
    "InvalidActionError",
    "MissingDependencyError",
    "MultiAgentEnv",
    "RegistrationError",
    "UnknownEnvError",
    "VectorEnv",
    "adapt",
    "check_env",
    "group_agents",
    "make",
    "make_vec",
    "register",
    "register_namespace",
    "registered_ids",
    "spec",
    "validate_actions",
]
