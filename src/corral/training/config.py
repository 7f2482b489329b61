"""Training configuration: run settings plus the algorithm's config, from YAML and overrides.

Settings come, later winning, from: the config dataclasses' defaults; the
algorithm's YAML file (``corral/training/configs/<algo>.yaml``); its
``envs:`` sections whose key (an env id or a glob such as ``mpe2/*``)
matches the env, globs in file order, then the exact id; and overrides
(``--set key=value`` on the command line, read as :mod:`corral.settings.grammar` says,
keyword arguments in Python).

Names are flat: a name is a field of :class:`RunConfig`, of the algorithm's
``Config``, or of both (``seed``, ``self_play``), and is set wherever it is a
field. ``env_kwargs.N=3`` sets one key of a dict setting. Values are typed
by the field's annotation, so ``total_steps=2e6`` is the int 2000000 and
``hidden=128,128`` the tuple ``(128, 128)``; a numeric setting's range is declared
next to its field (:mod:`corral.settings.ranges`) and checked when a config is built.

A run's ``config.yaml`` is read back by ``--resume``, ``corral eval`` and
``eval_opponent``: settings read from such a file may not import code
(:func:`check_imports`) unless the command line allows it (``--allow-import``,
or ``--import`` for a module in ``imports``).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import fnmatch
import importlib.resources
import numbers
import os
import re
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal

from corral.algos import ALGORITHMS, algorithm_class
from corral.algos import encoder_setting as encoders
from corral.algos.base import AlgoConfig, Algorithm
from corral.errors import ConfigError, GroupError, MissingDependencyError
from corral.groups import checked_group_map
from corral.registry import resolve
from corral.settings import SEED, Range, check_ranges, parse_settings, parse_value
from corral.training.policy_map import (
    FIXED,
    OBJECT,
    check_value,
    is_fixed,
    is_run_policy,
    parse_policies,
    written,
)
from corral.vector.backend import BACKENDS, backend_options
from corral.vector.shards import split_envs

DEVICES = ("cpu", "cuda", "auto")
BACKEND_OPTIONS = {
    "num_workers": "num_workers",
    "envs_per_worker": "envs_per_worker",
    "timeout": "timeout",
    "ray_address": "ray_address",
    "num_cpus_per_worker": "num_cpus_per_worker",
    "start_timeout": "start_timeout",
}
"""Run settings passed to the training envs' vector backend, and the backend's names for them."""
TIMEOUTS = ("timeout", "start_timeout")
"""Backend options in seconds: 0 sets no limit (the backend's ``None``), ``None`` (unset)
keeps the backend's default."""
WORKERS_PER_CPU, MIN_WORKER_LIMIT = 4, 64
"""A run starts at most ``max(MIN_WORKER_LIMIT, WORKERS_PER_CPU * CPUs)`` worker processes on
its machine (see :meth:`RunConfig.check_workers`): more only wait for a CPU."""
MAX_NUM_ENVS = 2**24
"""The most envs a run steps (a natively batched env's copies included)."""
MAX_RUNNERS = 4096
"""The most rollout workers (``runners``) a run starts."""
LONGEST_WAIT_S = 1e9
"""The longest time limit, in seconds, a timeout setting takes (about 31 years; threading and
Ray wait no longer, and 0 sets no limit)."""
RUNNER_BACKENDS = ("sync", "subproc")
RENAMED = {"worker_timeout": "timeout"}
"""Former names of run settings, still read from a run's ``config.yaml``."""
ALIASES = {
    "learning_rate": "lr",
    "discount": "gamma",
    "discount_factor": "gamma",
    "gae_lam": "gae_lambda",
    "lam": "gae_lambda",
    "lmbda": "gae_lambda",
    "n_envs": "num_envs",
    "n_steps": "rollout_steps",
    "num_steps": "rollout_steps",
    "total_timesteps": "total_steps",
    "n_epochs": "epochs",
    "ppo_epoch": "epochs",
    "update_epochs": "epochs",
    "num_minibatches": "minibatches",
    "num_mini_batch": "minibatches",
    "clip_range": "clip",
    "clip_param": "clip",
    "clip_coef": "clip",
    "entropy_coef": "ent_coef",
    "value_loss_coef": "vf_coef",
    "grad_clip": "max_grad_norm",
    "replay_size": "buffer_size",
    "hidden_sizes": "hidden",
    "net_arch": "hidden",
    "target_update_freq": "target_update_interval",
}
"""What other libraries (Stable-Baselines3, CleanRL, MAPPO's and EPyMARL's configs) call some
settings: an unknown setting of these names is told the setting it likely means."""
HOW_TO_RUN = {
    "progress": "Runner(config, progress=False); on the command line, --no-progress",
    "resume": "Runner.resume(run_dir); on the command line, --resume RUN",
    "allow_imports": "Runner(config, allow_imports=[...]); on the command line, --allow-import",
}
"""Keyword arguments of ``corral.train`` that say how to run a config, not what it holds (a
run's ``config.yaml`` does not keep them), and where they go beside :func:`load_config`."""
IMPORTING = {
    "algo": "a registered algorithm (" + ", ".join(sorted(ALGORITHMS)) + ")",
    "env": "a registered env id",
    "opponent": "'random'",
    "policy_map": "nothing",
}
"""Settings whose value may name code to import (``module:attr``; Gymnasium imports the
module of ``gym/module:Env-v0``), and what they may name when read from a file."""


@dataclass
class RunConfig:
    """What a training run does around the algorithm: env, budget, evaluation, output."""

    env: str = ""
    """Registered env id, e.g. ``mpe2/simple_spread_v3``, or ``module:attr`` of an env class."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env."""
    imports: tuple[str, ...] = ()
    """Modules imported before ``env`` is looked up: those of yours that register it with
    ``corral.register``. Read from a run's ``config.yaml``, only those the command line
    allows are imported (see :func:`check_imports`)."""
    num_envs: Annotated[int, Range(ge=1, le=MAX_NUM_ENVS)] = 8
    """Envs stepped in parallel."""
    backend: str = "sync"
    """Vector backend of the training envs: ``sync``, ``subproc`` or ``ray``."""
    num_workers: Annotated[int | None, Range(ge=1)] = None
    """Worker processes (``subproc``) or Ray actors (``ray``); ``None``: the backend's default."""
    envs_per_worker: Annotated[int | None, Range(ge=1)] = None
    """Envs per worker (``subproc``, ``ray``), instead of ``num_workers``."""
    timeout: Annotated[float | None, Range(ge=0, le=LONGEST_WAIT_S)] = None
    """Seconds a reset or step waits for the workers (``subproc``, ``ray``) before it fails
    with ``WorkerTimeoutError``; ``None``: the backend's default; 0: no limit."""
    ray_address: str | None = None
    """Ray cluster to join (``auto``, ``HEAD_IP:6379``, ``ray://HEAD_IP:10001``) when Ray is
    not running yet; ``None``: a local Ray of the run's own."""
    num_cpus_per_worker: Annotated[float | None, Range(gt=0)] = None
    """CPUs each Ray actor reserves (fractions allowed); ``None``: 1."""
    start_timeout: Annotated[float | None, Range(ge=0, le=LONGEST_WAIT_S)] = None
    """Seconds to wait for the workers (``subproc``), Ray actors (``ray``) or rollout workers
    (``runners``, on any backend) to start and build their envs, at the start and when one
    is replaced, before the run fails (on Ray saying which CPUs are short); ``None``: the
    backend's default (60); 0: no limit."""
    runners: Annotated[int, Range(ge=0, le=MAX_RUNNERS)] = 0
    """Rollout workers (Ray actors, one CPU each; see :mod:`corral.workers`) that each step a
    shard of the envs with a copy of the policies and send back whole rollouts, the learners
    staying in the runner's process (MAPPO, IPPO synchronously; DQN, MADDPG, VDN, QMIX
    asynchronously); 0: none, the run collects in its own process. Not with
    ``backend: ray``."""
    envs_per_runner: Annotated[int | None, Range(ge=1)] = None
    """Envs of each rollout worker (``runners`` of them: ``runners * envs_per_runner`` envs in
    all); ``None``: ``num_envs`` split over the runners."""
    runner_backend: Literal["sync", "subproc"] = "sync"
    """The vector backend of each rollout worker's envs."""
    sample_timeout: Annotated[float, Range(ge=0, le=LONGEST_WAIT_S)] = 300.0
    """Seconds a rollout worker's sample may take before the worker counts as lost (it is
    killed, and replaced as ``runner_restarts`` says); 0: no limit."""
    max_staleness: Annotated[int, Range(ge=0)] = 16
    """Asynchronous rollout workers (DQN, MADDPG, VDN/QMIX): the most versions a learner's
    weights may have moved on since a rollout was collected; older rollouts are dropped
    and counted in ``rollouts_dropped`` (rollouts arrive about ``runners - 1`` versions
    late)."""
    runner_restarts: bool = True
    """Replace a rollout worker that is lost (its process died, its node left, or it missed
    ``sample_timeout``), its partial rollout dropped and counted in ``rollouts_lost``, the
    replacements in the metrics column ``runner_restarts``; a worker lost 3 times in a row
    stops the run. ``False``: the first lost worker stops the run (``WorkerDiedError``,
    ``WorkerTimeoutError``)."""
    on_env_error: Literal["raise", "restart"] = "raise"
    """When one training env raises, returns a bad value or its worker misses ``timeout``:
    ``raise`` ends the run with that error (naming the env; ``checkpoint.pt`` stays as last
    written), ``restart`` cuts that env's episode (truncated), restarts the env, warns, counts
    it in the metrics column ``env_restarts`` and trains on. The other envs' step is kept
    either way."""
    native: bool | None = None
    """Step the training envs as one natively batched env (see ``corral.make_vec``);
    ``None``: where the env id has one and ``group_map`` is not set."""
    dtype: Literal["float64", "float32"] | None = None
    """What a natively batched env computes in (``corral.make_vec``'s ``dtype``: natively
    batched MPE takes ``float32`` for speed); ``None``: the env's default."""
    array: Literal["numpy", "torch"] | None = None
    """Where the training envs' batches live (``corral.make_vec``'s ``array``): NumPy on the
    host, or torch tensors on the run's ``device``, where a natively batched env then
    computes and the learners collect and learn with no host copy per step (MAPPO/IPPO
    from rollouts, DQN/MADDPG from replay memories on that device; not with ``self_play``).
    ``None``: torch where the run's device is a GPU and its training envs are one natively
    batched env on ``sync`` without ``self_play``, NumPy otherwise. Evaluations play on
    NumPy."""
    check_finite: bool | None = None
    """Stop at a NaN or inf in an observation, reward or state of a training env, naming the
    env, agent and field (see ``VectorEnv``); ``None``: on in debug mode (``CORRAL_DEBUG=1``
    or ``python -X dev``) only, as it costs time in every step."""
    torch_threads: Annotated[int | Literal["auto"], Range(ge=1)] = "auto"
    """PyTorch's CPU threads in the runner's process; ``auto``: 1, see
    :func:`corral.training.threads.torch_threads`."""
    group_map: Any = None
    """How agents form groups (``corral.group_agents``): ``None`` by name prefix, ``"agent"``..."""
    learn_groups: tuple[str, ...] = ()
    """Groups the algorithm learns (empty: all); the others are played by ``opponent``."""
    opponent: str = "random"
    """Policy of the groups not learned: ``random`` (uniform legal actions) or ``module:attr``."""
    policies: dict[str, Any] = field(default_factory=dict)
    """Which policy plays which agents (see :mod:`corral.training.policy_map`): a group or
    agent id -> an algorithm learned in the run (``mappo``...), ``fixed:random`` or
    ``fixed:MODULE:ATTR`` (in Python, also a ``Policy`` object); agents named nowhere are
    learned by the run's algorithm. On the command line ``--policies
    "adversary=mappo,agent=fixed:random"``."""
    policy_map: Any = None
    """A map of agents to ``policies`` by a function ``(agent, episode) -> policy id``
    (``module:attr``; in Python, the function): the keys of ``policies`` are then policy
    ids, and which agents each plays changes with the episodes (seat swapping); ``None``:
    the keys of ``policies`` are groups and agents."""
    self_play: bool = False
    """Learn a zero-sum game against snapshots of itself (its env declares metadata zero_sum=True;
    for algorithms that support it)."""
    total_steps: Annotated[int, Range(ge=1)] = 100_000
    """Env steps to train for (one per env per vector step)."""
    eval_every: Annotated[int, Range(ge=0)] = 10_000
    """Env steps between greedy evaluations (0: only at the end)."""
    eval_episodes: Annotated[int, Range(ge=1)] = 10
    """Episodes per evaluation (and games against ``eval_opponent``, shared by the seats)."""
    eval_explore: bool = False
    """Evaluate the exploring policies (sampled actions, epsilon-greedy Q-learners, fixed
    players as in training) instead of greedy ones: a memoryless greedy policy can stand
    still forever where its observation does not change (LBF)."""
    eval_opponent: str = "random"
    """Reference opponent of evaluations in two-player zero-sum games and self-play runs:
    ``random`` (uniformly random legal play), or a run directory (its ``best.pt``) or a
    checkpoint file of a run on the same env, played greedily."""
    select_by: str = "auto"
    """The evaluation column whose best value selects ``best.pt``: ``auto``
    (``eval_vs_opponent`` in two-player zero-sum games and self-play, else ``eval_return``),
    or a column such as ``eval_return/predator`` (see ``corral.training.scoring``)."""
    checkpoint_every: Annotated[int, Range(ge=0)] = 50_000
    """Env steps between checkpoints besides those at each evaluation (0: none besides)."""
    checkpoint_every_s: Annotated[float, Range(ge=0)] = 120.0
    """Seconds of wall clock between checkpoints besides the others (0: none besides); checked
    after every vector step, so that a killed run loses little."""
    checkpoint_replay: bool = True
    """Keep an off-policy learner's replay memories in ``checkpoint.pt`` (not in ``best.pt``)
    so that a resumed run learns on from them; they take about ``buffer_size`` rows."""
    log_every: Annotated[int, Range(ge=1)] = 2_000
    """Env steps between rows of ``metrics.csv``."""
    seed: Annotated[int, SEED] = 0
    """Seed of the envs, the algorithm and every random generator."""
    device: str = "auto"
    """``cpu``, ``cuda`` (or ``cuda:N``) or ``auto`` (a GPU when there is one)."""
    run_dir: str = ""
    """Where the run writes; empty: ``runs/<algo>-<env>-s<seed>-<time>``."""
    tensorboard: bool = True
    """Also write TensorBoard events when ``tensorboard`` is installed."""
    logger: tuple[Literal["wandb"], ...] = ()
    """Trackers that also get the run's config and every metrics row, beside ``metrics.csv``
    and TensorBoard (``tensorboard``): ``wandb`` (``pip install 'corral[track]'``), its files
    in the run directory, offline unless ``wandb_mode`` says otherwise."""
    wandb_project: str = "corral"
    """The wandb project of the run (``logger=wandb``)."""
    wandb_mode: Literal["offline", "online", "disabled"] | None = None
    """How the wandb run syncs (``logger=wandb``): ``offline`` (files only, ``wandb sync``
    uploads them later), ``online`` (needs the network and a login) or ``disabled``;
    ``None``: the environment's ``WANDB_MODE``, else ``offline``."""

    def __post_init__(self) -> None:
        if self.device not in DEVICES and not re.fullmatch(r"cuda:\d+", self.device):
            raise ConfigError(f"device must be one of {DEVICES} or cuda:N, got {self.device!r}")
        check_ranges(self)
        if self.array == "torch" and self.self_play:
            raise ConfigError(
                "self_play plays on numpy batches only: leave array at 'numpy' (got 'torch')"
            )
        if isinstance(self.policies, str):
            self.policies = parse_policies(self.policies) if self.policies else {}
        if not isinstance(self.policies, Mapping):
            raise ConfigError(
                f"policies must map groups or agents to policies, got {self.policies!r}"
            )
        # another run's policy is recorded by its absolute path, found from anywhere
        self.policies = {
            key: os.path.abspath(value) if is_run_policy(value) else value
            for key, value in self.policies.items()
        }
        if self.eval_opponent != "random" and os.path.exists(self.eval_opponent):
            # written to config.yaml as an absolute path, so a resumed run finds it from anywhere
            self.eval_opponent = os.path.abspath(self.eval_opponent)
        try:
            checked_group_map(self.group_map)
        except GroupError as err:
            raise ConfigError(str(err)) from None
        self._check_backend_options()
        self._check_runners()

    def _check_backend_options(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {sorted(BACKENDS)}, got {self.backend!r}")
        taken = backend_options(self.backend)
        for name, option in BACKEND_OPTIONS.items():
            if name in ("ray_address", "start_timeout") and self.runners > 0:
                continue  # the cluster the rollout workers start on, and how long they may take
            if getattr(self, name) is not None and option not in taken:
                takers = [b for b in BACKENDS if option in backend_options(b)]
                owners = " and ".join(takers) + (" backends" if len(takers) > 1 else " backend")
                raise ConfigError(
                    f"{name} is an option of the {owners}, not of backend {self.backend!r}: "
                    f"choose the backend or leave {name} unset (--set {name}=null where a "
                    "resumed run's config.yaml holds it)"
                )

    def _check_runners(self) -> None:
        if self.runners == 0:
            return
        if self.backend == "ray":
            raise ConfigError(
                f"runners={self.runners} with backend 'ray': rollout workers already spread the "
                "envs over Ray actors; leave backend at 'sync' (runner_backend chooses the "
                "backend inside each worker)"
            )
        if self.envs_per_runner is None and self.num_envs < self.runners:
            raise ConfigError(
                f"runners={self.runners} needs at least one env each, but num_envs is "
                f"{self.num_envs}: raise num_envs or set envs_per_runner"
            )
        if self.runner_backend not in RUNNER_BACKENDS:  # from Python, unchecked by the type
            raise ConfigError(
                f"runner_backend must be one of {list(RUNNER_BACKENDS)}, got "
                f"{self.runner_backend!r}"
            )

    def runner_envs(self) -> list[range]:
        """The envs of each rollout worker, as indices into the run's envs (empty: no
        ``runners``): ``envs_per_runner`` each, else ``num_envs`` split over them."""
        if self.runners == 0:
            return []
        if self.envs_per_runner is not None:
            per = self.envs_per_runner
            return [range(i * per, (i + 1) * per) for i in range(self.runners)]
        return split_envs(self.num_envs, num_workers=self.runners)

    def check_workers(self) -> None:
        """Refuse training envs or rollout workers (``runners``) that would start more worker
        processes on this machine than :data:`WORKERS_PER_CPU` per CPU (at least
        :data:`MIN_WORKER_LIMIT`): a run directory's ``config.yaml`` may come from anyone. A Ray
        cluster (``ray_address``) places its actors itself."""
        if self.ray_address is not None:
            return
        cpus = os.cpu_count() or 1
        limit = max(MIN_WORKER_LIMIT, WORKERS_PER_CPU * cpus)
        if self.runners > limit:  # each rollout worker is a process of a local Ray
            raise ConfigError(
                f"runners={self.runners} would start {self.runners} rollout worker processes on "
                f"this machine, more than its limit of {limit} ({WORKERS_PER_CPU} per CPU, "
                f"{cpus} CPUs, at least {MIN_WORKER_LIMIT}): set fewer runners, or give a Ray "
                "cluster's ray_address"
            )
        if self.backend == "sync":
            return
        counts = {}  # the workers each setting asks for (the backend's default: one per CPU)
        if self.num_workers is not None:
            counts["num_workers"] = min(self.num_workers, self.num_envs)
        if self.envs_per_worker is not None:
            counts["envs_per_worker"] = -(-self.num_envs // self.envs_per_worker)
        for name, count in counts.items():
            if count > limit:
                raise ConfigError(
                    f"num_envs={self.num_envs} with {name}={getattr(self, name)} would start "
                    f"{count} {self.backend} worker processes on this machine, more than its "
                    f"limit of {limit} ({WORKERS_PER_CPU} per CPU, {cpus} CPUs, at least "
                    f"{MIN_WORKER_LIMIT}): set a smaller num_workers or a larger envs_per_worker"
                )

    def backend_options(self) -> dict[str, Any]:
        """The backend options of the training envs that this run sets, by the backend's names
        (a timeout of 0 as ``None``, the backend's "no limit")."""
        options = {}
        taken = backend_options(self.backend)
        for name, option in BACKEND_OPTIONS.items():
            value = getattr(self, name)
            if value is not None and option in taken:
                options[option] = None if name in TIMEOUTS and value == 0 else value
        return options


@dataclass
class TrainConfig:
    """Everything a run needs: the algorithm, its config, and the run settings.

    ``algo`` is a registered name (``"mappo"``) or the ``module:attr`` of an
    :class:`~corral.algos.base.Algorithm` subclass.
    """

    algo: str
    run: RunConfig
    algo_config: AlgoConfig
    policy_configs: dict[str, AlgoConfig] = field(default_factory=dict)
    """The config of each policy id of ``run.policies`` learned by another algorithm than
    ``algo`` (the packaged defaults of that algorithm, with the settings given that it has)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists for tuples) as written to a run's ``config.yaml``."""
        run = _plain(
            dataclasses.asdict(dataclasses.replace(self.run, policies={}, policy_map=None))
        )
        run["policies"] = {key: written(value) for key, value in self.run.policies.items()}
        mapping = self.run.policy_map
        run["policy_map"] = None if mapping is None else written(mapping)
        return {
            "algo": self.algo,
            "run": run,
            "algo_config": _algo_written(self.algo_config),
            "policy_configs": {pid: _algo_written(cfg) for pid, cfg in self.policy_configs.items()},
        }

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        source: str = "the saved config",
        allow_imports: Collection[str] = (),
    ) -> TrainConfig:
        """The config that :meth:`to_dict` wrote, read from ``source`` (a run's ``config.yaml``,
        named in errors).

        Its settings import no code but the ``module:attr`` values named in
        ``allow_imports`` (see :func:`check_imports`); run settings under a
        former name (:data:`RENAMED`) are read under their new one.
        """
        algo = data.get("algo")
        if not isinstance(algo, str) or not algo:
            raise ConfigError(f"{source}: no algorithm: expected a line 'algo: NAME'")
        run, algo_values = (_section(data, key, source) for key in ("run", "algo_config"))
        check_imports(data, source, allow_imports)
        run = {RENAMED.get(key, key): value for key, value in run.items()}
        saved = _section(data, "policy_configs", source)
        try:
            algo, algo_cls = algorithm_spec(algo)
            run_config = _build(RunConfig, run)
            others = {
                pid: _build(algorithm_spec(run_config.policies[pid])[1].Config, dict(values or {}))
                for pid, values in saved.items()
            }
            return cls(algo, run_config, _build(algo_cls.Config, algo_values), others)
        except (ValueError, KeyError) as err:  # ConfigError, an unknown algorithm or policy
            raise ConfigError(f"{source}: {err}") from err


def _algo_written(config: AlgoConfig) -> dict[str, Any]:
    """An algorithm's config as ``config.yaml`` records it (an encoder factory by name)."""
    values = _plain(dataclasses.asdict(config))
    if "encoder" in values:
        values["encoder"] = encoders.written(values["encoder"])
    return values


def check_imports(data: Mapping[str, Any], source: str, allow_imports: Collection[str]) -> None:
    """Refuse a saved config (``to_dict``'s layout) whose settings would import code.

    Code given by ``module:attr`` in a file runs on reading that file: a run
    directory from someone else could run anything under ``corral eval``. So
    ``algo``, ``env`` and ``opponent`` (:data:`IMPORTING`) read from the file
    ``source`` may hold a colon only where ``allow_imports`` names the value,
    and each module in ``imports`` must be named there.
    """
    run = data.get("run")
    run = run if isinstance(run, Mapping) else {}
    for setting, allowed in IMPORTING.items():
        value = data.get("algo") if setting == "algo" else run.get(setting)
        if isinstance(value, str) and ":" in value and value not in allow_imports:
            raise ConfigError(
                f"{source}: {setting} {value!r} would import the module {_module(value)!r},"
                f" and a setting read from a file may only name {allowed}. If you trust it,"
                f" allow it on the command line: --allow-import {value}"
                f" (Python: allow_imports=[{value!r}])"
            )
    sections = [data.get("algo_config"), *dict(data.get("policy_configs") or {}).values()]
    for section in sections:
        value = section.get("encoder") if isinstance(section, Mapping) else None
        if isinstance(value, str) and ":" in value and value not in allow_imports:
            if value.startswith(encoders.OBJECT):
                continue  # refused when the networks are built, with what to do instead
            raise ConfigError(
                f"{source}: encoder {value!r} would import the module {_module(value)!r}, and "
                f"a setting read from a file may only name {list(encoders.BUILT_IN)}. If you "
                f"trust it, allow it on the command line: --allow-import {value}"
                f" (Python: allow_imports=[{value!r}])"
            )
    policies = run.get("policies")
    for key, value in policies.items() if isinstance(policies, Mapping) else ():
        code = value.removeprefix(FIXED) if isinstance(value, str) else ""
        if code.startswith(OBJECT) or is_run_policy(value):
            continue  # an object is refused when the run is built; a run's config is checked
        if ":" in code and value not in allow_imports:
            raise ConfigError(
                f"{source}: policies {key}={value} would import the module {_module(code)!r}, "
                "and a setting read from a file may only name registered algorithms and "
                f"fixed:random. If you trust it, allow it on the command line: --allow-import "
                f"{value} (Python: allow_imports=[{value!r}])"
            )
    try:  # read as the config will be, so that what is checked is what is imported
        modules = coerce(run.get("imports") or (), tuple[str, ...])
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: setting imports={run['imports']!r}: {err}") from None
    for module in modules:
        if module not in allow_imports:
            raise ConfigError(
                f"{source}: imports {module!r} would import the module {module!r} (for the "
                f"run's env {run.get('env')!r}), and a setting read from a file may import no "
                f"module. If you trust it, allow it on the command line: --allow-import "
                f"{module} (Python: allow_imports=[{module!r}])"
            )


def _module(value: str) -> str:
    """The module that ``module:attr`` (or Gymnasium's ``gym/module:Env-v0``) imports."""
    return value.partition(":")[0].rpartition("/")[2]


def _section(data: Mapping[str, Any], key: str, source: str) -> dict[str, Any]:
    section = data.get(key) or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{source}: {key} must be a mapping of settings, got {section!r}")
    return dict(section)


def algorithm_spec(algo: str | type[Algorithm]) -> tuple[str, type[Algorithm]]:
    """The name to record and the class of an algorithm given by name, ``module:attr`` or class."""
    if isinstance(algo, type):
        return f"{algo.__module__}:{algo.__qualname__}", algo
    if ":" in algo:
        try:
            found = resolve(algo)
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"cannot load the algorithm {algo!r}: {err}") from err
        if not (isinstance(found, type) and issubclass(found, Algorithm)):
            raise ConfigError(f"{algo!r} is not a subclass of corral.algos.base.Algorithm")
        return algo, found
    return algo, algorithm_class(algo)


def load_config(
    algo: str | type[Algorithm],
    env: str | None = None,
    overrides: Mapping[str, Any] | Sequence[str] = (),
    *,
    defaults: Mapping[str, Any] | None = None,
) -> TrainConfig:
    """The effective config of training ``algo`` on ``env``.

    ``algo`` is a registered name, a ``module:attr`` or an algorithm class.
    ``overrides`` is a mapping of names to values, or ``"key=value"`` strings;
    ``defaults`` replaces the algorithm's packaged YAML file (for tests and
    user config files).
    """
    algo, algo_cls = algorithm_spec(algo)
    user = dict(overrides) if isinstance(overrides, Mapping) else parse_settings(overrides)
    if env is not None:
        user["env"] = env
    env_id = user.get("env")
    if not env_id:
        raise ConfigError("no env given: pass --env ID (Python: env=ID)")
    if defaults is None:
        defaults = packaged_defaults(algo if algo in ALGORITHMS else getattr(algo_cls, "name", ""))
    file = dict(defaults)
    layers = [*_env_layers(file.pop("envs", None) or {}, str(env_id)), user]
    settings = file
    for layer in layers:
        settings = _merge(settings, layer)
    policies = settings.get("policies") or {}
    policies = parse_policies(policies) if isinstance(policies, str) else policies
    others = _policy_algorithms(policies, algo)
    also = {f.name for cls in others.values() for f in fields(cls.Config)}
    run_values, algo_values = _split(settings, algo_cls.Config, also)
    run = _build(RunConfig, run_values)
    configs = {
        pid: _policy_config(cls, str(policies[pid]), str(env_id), user)
        for pid, cls in others.items()
    }
    return TrainConfig(algo, run, _build(algo_cls.Config, algo_values), configs)


@dataclass
class Defaults:
    """The settings of an algorithm before any override, as ``corral train ALGO --help``
    shows them."""

    run: RunConfig
    algo_config: AlgoConfig
    file: str | None
    """The packaged YAML file applied (``mappo.yaml``); ``None`` where the algorithm has none."""
    sections: list[str]
    """The keys of that file's ``envs:`` sections applied, in order (none without an env)."""


def effective_defaults(algo: str | type[Algorithm], env: str | None = None) -> Defaults:
    """The settings of training ``algo`` before any override: the config dataclasses'
    defaults, the algorithm's packaged YAML file and, where ``env`` is given, that file's
    ``envs:`` sections matching it (as :func:`load_config` layers them)."""
    algo, algo_cls = algorithm_spec(algo)
    name = algo if algo in ALGORITHMS else getattr(algo_cls, "name", "")
    file = packaged_defaults(name)
    settings = dict(file)
    sections = settings.pop("envs", None) or {}
    keys = env_sections(sections, env) if env else []
    for key in keys:
        settings = _merge(settings, dict(sections[key] or {}))
    if env:
        settings["env"] = env
    run_values, algo_values = _split(settings, algo_cls.Config)
    return Defaults(
        _build(RunConfig, run_values),
        _build(algo_cls.Config, algo_values),
        f"{name}.yaml" if file else None,
        keys,
    )


def _policy_algorithms(policies: Mapping[str, Any], algo: str) -> dict[str, type[Algorithm]]:
    """The class of each learned policy of ``policies`` whose algorithm is not ``algo``."""
    found = {}
    for pid, value in policies.items():
        if is_fixed(value) or value == algo or value.startswith(OBJECT):
            continue
        check_value(pid, value)  # a path that is no run directory
        try:
            found[pid] = algorithm_spec(value)[1]
        except ValueError as err:  # an unknown algorithm
            raise ConfigError(f"policies: {pid}={value}: {err}") from err
    return found


def _policy_config(
    algo_cls: type[Algorithm], name: str, env: str, user: Mapping[str, Any]
) -> AlgoConfig:
    """The config of a policy learned by ``algo_cls`` (registered as ``name``): its packaged
    defaults for ``env``, then those of the ``user``'s settings it has."""
    file = packaged_defaults(name if name in ALGORITHMS else getattr(algo_cls, "name", ""))
    settings = file
    for layer in [*_env_layers(file.pop("envs", None) or {}, env), user]:
        settings = _merge(settings, layer)
    names = {f.name for f in fields(algo_cls.Config)}
    return _build(algo_cls.Config, {k: v for k, v in settings.items() if k in names})


def replace_run(run: RunConfig, **changes: Any) -> RunConfig:
    """A copy of ``run`` with ``changes`` typed and applied."""
    return _build(RunConfig, {**dataclasses.asdict(run), **changes})


def packaged_defaults(algo: str) -> dict[str, Any]:
    """The settings of ``configs/<algo>.yaml`` shipped with corral (empty if there is none)."""
    if not re.fullmatch(r"\w+", algo):
        return {}
    resource = importlib.resources.files("corral.training") / "configs" / f"{algo}.yaml"
    if not resource.is_file():
        return {}
    return read_yaml(resource.read_text(), source=str(resource))


def read_yaml_file(path: str | Path) -> dict[str, Any]:
    """The YAML mapping in the file ``path``; a :class:`ConfigError` naming it if it has none."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read {path}: {err}") from err
    return read_yaml(text, source=str(path))


def read_yaml(text: str, *, source: str = "<text>") -> dict[str, Any]:
    """A YAML mapping (an empty document is an empty mapping); errors name ``source``."""
    yaml = _yaml()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}{_yaml_problem(err)}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: a config file must hold a mapping (lines 'key: value'), "
            f"got a {type(data).__name__}"
        )
    return data


def _yaml_problem(err: Exception) -> str:
    """``", line 3, column 7: invalid YAML: mapping values are not allowed here"``."""
    mark = getattr(err, "problem_mark", None)
    where = "" if mark is None else f", line {mark.line + 1}, column {mark.column + 1}"
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    return f"{where}: invalid YAML: {problem}" + (f" ({context})" if context else "")


def write_yaml(data: Mapping[str, Any]) -> str:
    """``data`` as YAML, keys in insertion order."""
    return _yaml().safe_dump(dict(data), sort_keys=False)


def _yaml() -> types.ModuleType:
    try:
        import yaml
    except ModuleNotFoundError as err:
        raise MissingDependencyError(
            "training configs need PyYAML, which is not installed: pip install 'corral[train]'"
        ) from err
    return yaml


def _env_layers(sections: Mapping[str, Any], env: str) -> list[dict[str, Any]]:
    """The ``envs:`` sections that apply to ``env``, in the order they apply."""
    return [dict(sections[key] or {}) for key in env_sections(sections, env)]


def env_sections(sections: Mapping[str, Any], env: str) -> list[str]:
    """The keys of the ``envs:`` sections that apply to ``env``: matching globs in file
    order, then the exact id."""
    globs = [k for k in sections if k != env and fnmatch.fnmatchcase(env, k)]
    return [*globs, *([env] if env in sections else [])]


def _merge(base: Mapping[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``layer``; a dotted key ``a.b`` sets key ``b`` of dict setting ``a``."""
    out = dict(base)
    for key, value in layer.items():
        name, _, sub = key.partition(".")
        if sub:
            inner = out.get(name)
            inner = dict(inner) if isinstance(inner, Mapping) else {}
            inner[sub] = value
            out[name] = inner
        else:
            out[key] = value
    return out


def _split(
    settings: Mapping[str, Any], algo_config: type, also: Collection[str] = ()
) -> tuple[dict, dict]:
    """The run's and the algorithm's settings of ``settings``; names in ``also`` (settings of
    other algorithms of the run's policies) are known but belong to neither."""
    run_names = {f.name for f in fields(RunConfig)}
    algo_names = {f.name for f in fields(algo_config)}
    unknown = sorted(set(settings) - run_names - algo_names - set(also))
    if unknown:
        known = sorted(run_names | algo_names)
        hints = {name: difflib.get_close_matches(name, known, n=1) for name in unknown}
        hints.update({n: [ALIASES[n]] for n in unknown if ALIASES.get(n) in known})
        hints.update({name: [RENAMED[name]] for name in unknown if name in RENAMED})
        notes = {n: f" (did you mean {h[0]!r}?)" if h else "" for n, h in hints.items()}
        for name in set(unknown) & set(HOW_TO_RUN):
            notes[name] = f" (a way to run, not a setting of the run: {HOW_TO_RUN[name]})"
        said = ", ".join(f"{name!r}{note}" for name, note in notes.items())
        raise ConfigError(f"unknown setting(s) {said}; known: {', '.join(known)}")
    run = {k: v for k, v in settings.items() if k in run_names}
    algo = {k: v for k, v in settings.items() if k in algo_names}
    return run, algo


def _build(cls: type, values: Mapping[str, Any]) -> Any:
    """``cls(**values)`` with every value coerced to its field's type."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"{cls.__name__} has no setting(s) {unknown}")
    typed = {}
    for name, value in values.items():
        try:
            typed[name] = coerce(value, hints[name])
        except (TypeError, ValueError) as err:
            raise ConfigError(f"setting {name}={value!r}: {err}") from None
    try:
        return cls(**typed)
    except TypeError as err:
        raise ConfigError(f"cannot build {cls.__name__}: {err}") from err


def coerce(value: Any, annotation: Any) -> Any:
    """``value`` (a string from the command line, or YAML/Python data) as type ``annotation``.

    Raises ``ValueError`` or ``TypeError`` saying what was expected.
    """
    if annotation is Any:
        return value
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, args)
    if origin is collections.abc.Callable:
        if not callable(value):
            raise TypeError(f"expected a callable, got {value!r}")
        return value
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"expected one of {list(args)}")
        return value
    if origin in (tuple, list):
        return _coerce_sequence(value, origin, args)
    if origin is dict or annotation is dict:
        value = parse_value(value) if isinstance(value, str) else value
        if not isinstance(value, Mapping):
            raise TypeError(f"expected a mapping, got {value!r}")
        return dict(value)
    if annotation is bool:
        return _coerce_bool(value)
    if annotation is int:
        return _coerce_int(value)
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
            raise TypeError(f"expected a number, got {value!r}")
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
    if annotation is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise TypeError(f"expected a string, got {value!r}")
        return str(value)
    raise TypeError(f"settings of type {annotation} are not supported")


def _coerce_union(value: Any, args: tuple) -> Any:
    if type(None) in args and (value is None or (isinstance(value, str) and _is_null(value))):
        return None
    errors = []
    for arm in (a for a in args if a is not type(None)):
        try:
            return coerce(value, arm)
        except (TypeError, ValueError) as err:
            errors.append(str(err))
    raise ValueError("; ".join(errors))


def _coerce_sequence(value: Any, origin: type, args: tuple) -> Any:
    if isinstance(value, str):
        text = value.strip()
        value = (
            parse_value(text)
            if text.startswith(("[", "("))
            else [p.strip() for p in text.split(",") if p.strip()]
        )
        if isinstance(value, str):
            value = [value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a sequence, got {value!r}")
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(value):
            raise ValueError(f"expected {len(args)} items, got {len(value)}")
        return tuple(coerce(v, a) for v, a in zip(value, args, strict=True))
    item = args[0] if args else Any
    return origin(coerce(v, item) for v in value)


def _coerce_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "yes", "on", "1"):
            return True
        if text in ("false", "no", "off", "0"):
            return False
    raise ValueError(f"expected true or false, got {value!r}")


def _coerce_int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    if isinstance(value, str):
        value = float(value.replace("_", "")) if re.search(r"[.eE]", value) else int(value)
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"expected an integer, got {value!r}")
        return int(value)
    if isinstance(value, int):
        return value
    raise TypeError(f"expected an integer, got {value!r}")


def _is_null(text: str) -> bool:
    return not text.strip() or parse_value(text) is None


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively, so ``yaml.safe_dump`` writes plain YAML."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
