"""corral's exception hierarchy.

Every error corral raises derives from :class:`CorralError`, and also from the
built-in exception a Python user would reach for first (``ValueError`` for bad
input, ``ImportError`` for a missing extra, ``LookupError`` for an unknown id),
so ``except ValueError`` keeps working in code that does not know corral.
"""

from __future__ import annotations


class CorralError(Exception):
    """Base class of every error raised by corral."""


class UnknownEnvError(CorralError, LookupError):
    """An env id that is not registered."""

    def __str__(self) -> str:  # LookupError would quote the message like a key
        return str(self.args[0]) if self.args else ""


class RegistrationError(CorralError, ValueError):
    """An env id registered twice, or an entry point that cannot be resolved."""


class ConfigError(CorralError, ValueError):
    """A setting that is unknown, of the wrong type, out of its range, or cannot be used."""


class MissingDependencyError(CorralError, ImportError):
    """An optional dependency (a ``pip install corral[extra]``) is not installed."""


class InvalidActionError(CorralError, ValueError):
    """An action dict that does not fit the agents that must act, or their spaces."""


class EpisodeOverError(CorralError, RuntimeError):
    """``step`` called before ``reset`` or after the episode ended."""


class GroupError(CorralError, ValueError):
    """Agents put in one group although their spaces differ."""


class ExportError(CorralError, ValueError):
    """An env asked for in a form it cannot take: ``corral.to_pettingzoo(env, api="parallel")``
    on an env that is not simultaneous, ``corral.to_gymnasium`` on a multi-agent env."""


class UnsupportedEnvError(CorralError, ValueError):
    """An algorithm asked to learn an env it cannot handle (MADDPG on a turn-based game)."""


class CheckpointError(CorralError, ValueError):
    """A checkpoint file that cannot be loaded (empty, truncated, damaged, of another format
    or version, or not a corral checkpoint), or a value a checkpoint cannot hold."""


class EnvContractError(CorralError):
    """An env that breaks the env contract (raised by the conformance checker)."""

    def __init__(self, violations: list[str]) -> None:
        self.violations = list(violations)
        lines = "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(f"{len(self.violations)} contract violation(s):\n{lines}")


class EnvError(CorralError, RuntimeError):
    """An exception raised inside one env of a vector env, with that env's index.

    ``remote_traceback`` holds the traceback as the env's process saw it.
    """

    def __init__(self, env_index: int, message: str, remote_traceback: str = "") -> None:
        self.env_index = env_index
        self.remote_traceback = remote_traceback
        text = f"env {env_index}: {message}"
        if remote_traceback:
            text += f"\n\nTraceback in the env's process:\n{remote_traceback}"
        super().__init__(text)

    def __reduce__(self) -> tuple[type, tuple[int, str, str]]:
        message = str(self).split(": ", 1)[1].split("\n\nTraceback", 1)[0]
        return (type(self), (self.env_index, message, self.remote_traceback))


class VectorStateError(CorralError, RuntimeError):
    """A vector env call out of order: a ``*_wait`` with nothing pending, a second
    ``*_async`` before the first's wait, or any call after ``close()``."""


class WorkerTimeoutError(CorralError, TimeoutError):
    """A worker did not answer within the timeout; it is stopped and restarted."""


class WorkerDiedError(CorralError, RuntimeError):
    """A worker process died while answering a call; it is restarted at the next reset or step."""


class WorkerStartError(WorkerDiedError):
    """Workers that could not be started: a worker process died before it built its
    envs, or Ray could not place the workers (the cluster lacks the resources they
    reserve, or they did not start within the start timeout). Nothing they started is
    left running.

    ``exit_codes`` maps each worker process that died to its exit code (negative:
    the signal that killed it); it is empty where no process died.
    """

    def __init__(self, message: str, exit_codes: dict[int, int | None] | None = None) -> None:
        super().__init__(message)
        self.exit_codes = dict(exit_codes or {})

    def __reduce__(self) -> tuple[type, tuple[str, dict[int, int | None]]]:
        return (type(self), (self.args[0], self.exit_codes))


class WorkerRestartWarning(UserWarning):
    """A worker process died and was restarted: its envs were reset mid-episode."""


class CheckIncompleteWarning(UserWarning):
    """``check_env`` found no violation, but no episode ended: some rules went unchecked."""
