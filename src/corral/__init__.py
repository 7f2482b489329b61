"""corral: one contract, fast vectorised sampling and correct learning for MARL envs."""

from corral.adapters import adapt
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

__version__ = "0.1.0"

__all__ = [
    "CorralError",
    "EnvContractError",
    "EpisodeOverError",
    "GroupError",
    "InvalidActionError",
    "MissingDependencyError",
    "MultiAgentEnv",
    "RegistrationError",
    "UnknownEnvError",
    "adapt",
    "check_env",
    "group_agents",
    "make",
    "register",
    "register_namespace",
    "registered_ids",
    "spec",
    "validate_actions",
]


def check_env(env, **kwargs):
    """Run the conformance checker on ``env``; see :func:`corral.checker.check_env`."""
    from corral.checker import check_env as _check_env

    return _check_env(env, **kwargs)
