"""corral's exception hierarchy.

Every error corral raises derives from :class:`CorralError`, and also from the
built-in exception a Python user would reach for first (``ValueError`` for bad
input, ``ImportError`` for a missing extra, ``LookupError`` for an unknown id),
so ``except ValueError`` keeps working in code that does not know corral.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.vector.vector_env import Batch


class CorralError(Exception):
    """Base class of every error raised by corral."""


class UnknownEnvError(CorralError, LookupError):
    """An env id that is not registered."""

    def __str__(self) -> str:  # LookupError would quote the message like a key
        return str(self.args[0]) if self.args else ""


class UnknownAgentError(CorralError, KeyError):
    """An agent or group name that the vector env does not have; the message lists its
    groups and their agents."""

    def __str__(self) -> str:  # KeyError would quote the message like a key
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
    """An env corral cannot play as asked: an algorithm asked to learn an env it cannot
    handle (MADDPG on a turn-based game), or a Gymnasium env that declares several agents
    without following the convention of EPyMARL's envs (``n_agents``, Tuple spaces)."""


class CheckpointError(CorralError, ValueError):
    """A checkpoint file that cannot be loaded (empty, truncated, damaged, of another format
    or version, or not a corral checkpoint), or a value a checkpoint cannot hold."""


class EvaluationError(CorralError, RuntimeError):
    """An evaluation whose envs' faults cut more episodes than the whole ones it averages:
    it gave up rather than play on (see ``corral.training.whole_episodes``)."""


class EnvContractError(CorralError):
    """An env that breaks the env contract (raised by the conformance checker)."""

    def __init__(self, violations: list[str]) -> None:
        self.violations = list(violations)
        lines = "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(f"{len(self.violations)} contract violation(s):\n{lines}")


class EnvError(CorralError, RuntimeError):
    """An exception raised inside one env of a vector env, with that env's index.

    ``remote_traceback`` holds the traceback as the env's process saw it. Raised by a
    vector step or reset (see ``on_env_error`` of :class:`~corral.vector.VectorEnv`):

    * ``restarted``: the env was rebuilt and reset, so its row of the batch holds a new
      episode (the cut one ended truncated); ``False`` where that failed too, or for a
      fault outside a step or reset (``call``, ``get_attr``, ``set_attr``);
    * ``faults``: every fault of the same call, the first by env index first (this
      error, the other envs' :class:`EnvError`, a :class:`WorkerTimeoutError`);
    * ``batch``: the batch of that step or reset, every env that did not fail included
      (set by the vector env; ``None`` otherwise);
    * ``copies``: where the fault struck a natively batched env, all of its copies (they
      restart together; ``env_index`` is the first); ``None`` for one env.
    """

    def __init__(
        self,
        env_index: int,
        message: str,
        remote_traceback: str = "",
        restarted: bool = False,
        copies: range | None = None,
    ) -> None:
        self.env_index = env_index
        self.message = message
        self.remote_traceback = remote_traceback
        self.restarted = restarted
        self.copies = copies
        self.faults: list[Fault] = [self]
        self.batch: Batch | None = None
        text = f"env {env_index}: {message}"
        if remote_traceback:
            text += f"\n\nTraceback in the env's process:\n{remote_traceback}"
        super().__init__(text)

    def __reduce__(self) -> tuple[type, tuple[int, str, str, bool, range | None], dict]:
        args = (self.env_index, self.message, self.remote_traceback, self.restarted, self.copies)
        return (type(self), args, {"faults": self.faults, "batch": self.batch})

    @property
    def last_line(self) -> str:
        """The last line of the env's traceback (the exception), else of the message."""
        return _last_line(self.remote_traceback) or _last_line(self.message)

    def moved(self, offset: int) -> EnvError:
        """This error with its env indices ``offset`` further on (a rollout worker's envs are
        the run's envs from ``offset`` on), its other faults' too."""
        copies = self.copies
        moved = type(self)(
            self.env_index + offset,
            self.message,
            self.remote_traceback,
            self.restarted,
            None if copies is None else range(copies.start + offset, copies.stop + offset),
        )
        moved.faults = [moved if f is self else _moved(f, offset) for f in self.faults]
        moved.batch = self.batch
        return moved


class VectorStateError(CorralError, RuntimeError):
    """A vector env call out of order: a ``*_wait`` with nothing pending, a second
    ``*_async`` before the first's wait, or any call after ``close()``."""


class WorkerTimeoutError(CorralError, TimeoutError):
    """A worker did not answer within the timeout; it is stopped and restarted.

    ``env_indices`` are the envs of the late workers. In a vector step or reset they
    are restarted at once (``restarted``: their episodes end truncated in the batch);
    ``faults`` and ``batch`` are as for :class:`EnvError`.
    """

    def __init__(
        self, message: str, env_indices: list[int] | None = None, restarted: bool = False
    ) -> None:
        super().__init__(message)
        self.env_indices = list(env_indices or [])
        self.restarted = restarted
        self.faults: list[Fault] = [self]
        self.batch: Batch | None = None

    def __reduce__(self) -> tuple[type, tuple[str, list[int], bool], dict]:
        args = (self.args[0], self.env_indices, self.restarted)
        return (type(self), args, {"faults": self.faults, "batch": self.batch})

    @property
    def last_line(self) -> str:
        return _last_line(self.args[0])

    def moved(self, offset: int) -> WorkerTimeoutError:
        """This error with its env indices ``offset`` further on (as :meth:`EnvError.moved`)."""
        moved = type(self)(self.args[0], [i + offset for i in self.env_indices], self.restarted)
        moved.faults = [moved if f is self else _moved(f, offset) for f in self.faults]
        moved.batch = self.batch
        return moved


class WorkerDiedError(CorralError, RuntimeError):
    """A worker died during (or before) a ``call``, ``get_attr`` or ``set_attr``; it is
    restarted at the next reset or step (a worker that dies in a reset or step is
    restarted within it, with a :class:`WorkerRestartWarning`).

    ``env_indices`` are the envs of the dead workers; ``faults`` as for :class:`EnvError`.
    """

    batch: Batch | None
    """Where a vector step or reset raises it: that step's batch (set by the vector env)."""

    def __init__(self, message: str, env_indices: list[int] | None = None) -> None:
        super().__init__(message)
        self.env_indices = list(env_indices or [])
        self.faults: list[Fault] = [self]
        self.batch = None

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.args[0], self.env_indices)
        return (type(self), args, {"faults": self.faults, "batch": self.batch})


class WorkerStartError(WorkerDiedError):
    """Workers that could not be started: a worker process died before it built its
    envs, or Ray could not place the workers (the cluster lacks the resources they
    reserve, or they did not start within the start timeout). Nothing they started is
    left running.

    ``exit_codes`` maps each worker process that died to its exit code (negative:
    the signal that killed it); it is empty where no process died. ``env_indices``: the
    envs of workers that did not start in time, where the backend says.
    """

    def __init__(
        self,
        message: str,
        exit_codes: dict[int, int | None] | None = None,
        env_indices: list[int] | None = None,
    ) -> None:
        super().__init__(message, env_indices)
        self.exit_codes = dict(exit_codes or {})

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.args[0], self.exit_codes, self.env_indices)
        return (type(self), args, {"faults": self.faults, "batch": self.batch})


Fault = EnvError | WorkerTimeoutError | WorkerDiedError
"""A fault that a vector call collects in ``faults``."""


def envs_text(envs: range) -> str:
    """``"env 3"`` or ``"envs 2-4"``."""
    return f"env {envs[0]}" if len(envs) == 1 else f"envs {envs[0]}-{envs[-1]}"


def _moved(fault: Fault, offset: int) -> Fault:
    """``fault`` with its env indices ``offset`` further on where it names them for a restart
    (a worker's death is the worker set's to name)."""
    return fault.moved(offset) if isinstance(fault, (EnvError, WorkerTimeoutError)) else fault


class WorkerRestartWarning(UserWarning):
    """A worker that died (or missed the timeout of a call other than a reset or step) was
    replaced in a reset or step: its envs were reset mid-episode, the cut episodes ending
    truncated."""


class EnvRestartWarning(WorkerRestartWarning):
    """An env failed in a step or reset (it raised, or its worker missed the timeout) and
    was restarted (``on_env_error="restart"``): its episode ended truncated. ``fault`` is
    that failure."""

    def __init__(self, fault: EnvError | WorkerTimeoutError) -> None:
        if isinstance(fault, EnvError) and fault.copies is not None and len(fault.copies) > 1:
            what = (
                f"{envs_text(fault.copies)} (one natively batched env) failed and were "
                "restarted; their episodes end"
            )
        elif isinstance(fault, EnvError):
            what = f"env {fault.env_index} failed and was restarted; its episode ends"
        else:
            what = f"envs {fault.env_indices} were restarted; their episodes end"
        super().__init__(
            f"{what} truncated in this batch (on_env_error='restart'): {fault.last_line}"
        )
        self.fault = fault

    def __reduce__(self) -> tuple[type, tuple[EnvError | WorkerTimeoutError]]:
        return (type(self), (self.fault,))


class CheckIncompleteWarning(UserWarning):
    """``check_env`` found no violation, but no episode ended: some rules went unchecked."""


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
