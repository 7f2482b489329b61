"""The ``corral`` command line: list, check and play envs; train, evaluate and plot runs.

    corral list [SOURCE] [--import MODULE ...]
    corral check ID [--seed S] [--steps N] [--step-cap N] [--num-envs E] [--native-only]
                    [--timeout SECONDS] [--set key=value ...] [--import MODULE ...]
    corral play ID [--episodes N] [--seed S] [--set key=value ...] [--import MODULE ...]
    corral train ALGO --env ID [--num-envs N] [--total-steps N] [--set key=value ...]
                 [--policies KEY=VALUE,...] [--import MODULE ...]
    corral train --resume RUN [--total-steps N] [--import MODULE ...]
                 [--allow-import MODULE:ATTR|MODULE ...]
    corral sweep ALGO --env ID --space sweep.yaml --trials N [--parallel K] [--backend process|ray]
                 [--sweep-dir DIR] [--pruner median|none] [--total-steps N] [--seed S]
                 [--set key=value ...] [--import MODULE ...]
    corral eval RUN [--episodes N] [--opponent random|RUN] [--policies KEY=VALUE,...]
                [--gif out.gif] [--import ...] [--allow-import ...] [--ray-address ADDRESS]
    corral plot RUN [RUN ...] [--metric COLUMN] [--reference NAME=VALUE ...] [--baselines]
                -o curves.png

``ID`` is a registered id (``mpe2/simple_spread_v3``) or an entry point
``module:attr`` (``examples.custom_env:Nim``, importable from the current
directory). ``--import MODULE`` imports a module of yours (from the current
directory too) before the id is looked up, so that the ids it registers are
known; ``train`` records it in the run's ``config.yaml``. A run directory's
``config.yaml`` is read by ``--resume``, ``eval`` and ``eval_opponent``; a
``module:attr`` there (code to import) is refused unless ``--allow-import
MODULE:ATTR`` names it, and a module in its ``imports`` unless ``--allow-import
MODULE`` or ``--import MODULE`` names it. ``check`` also checks an id's natively
batched implementation, if it has one: in numpy, and in torch (on the CPU, and on a GPU
if torch sees one) where torch is installed, each copy compared with the dict env; each
implementation in a child process, so that an env that hangs (a call longer than
``--timeout``) or ends its process is reported in one line. Exit
codes: 0 success, 1 contract violations (or an env that hung or ended its process), 2 an
id, source or argument that cannot be used,
3 a check that found no violation but ended no episode (the rules about how episodes end
went unchecked), 141 output cut short by its reader (``corral list | head``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.metadata
import importlib.util
import logging
import math
import os
import re
import shutil
import sys
import textwrap
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from itertools import groupby
from pathlib import Path
from typing import Any

from corral.algos import ALGORITHMS
from corral.checks import (
    NUM_ENVS,
    STEP_CAP,
    CheckReport,
    RandomPolicy,
    check_env,
    reporting_calls,
)
from corral.checks.watched import WorkExited, WorkHung, run_watched
from corral.errors import (
    CheckIncompleteWarning,
    CheckpointError,
    ConfigError,
    EnvError,
    EvaluationError,
    MissingDependencyError,
    RegistrationError,
    UnknownEnvError,
    UnsupportedEnvError,
    WorkerStartError,
    WorkerTimeoutError,
)
from corral.registry import (
    batched_ids,
    import_modules,
    make,
    namespace,
    namespaces,
    registered_ids,
    spec,
)
from corral.settings import SEED, Range, parse_settings, parse_value

BROKEN_PIPE = 141
"""Exit code when stdout's reader closes it early: a shell's code for a process ended by SIGPIPE."""


class UsageError(Exception):
    """A command line that cannot be carried out; its message is shown without a traceback."""


_ALGOS = ", ".join(ALGORITHMS)
"""The registered algorithms, as the help lists them."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (``sys.argv[1:]`` by default); returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        _import_user_code(args)
        code = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not in Python's flush at exit
        return code
    except UsageError as err:
        print(f"corral: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`corral list | head`): end quietly, as the Python docs
        # advise, with stdout on devnull so that the flush at exit cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="corral", description="Multi-agent RL envs under one contract.", allow_abbrev=False
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="list the registered env ids")
    listing.add_argument("source", nargs="?", help="only the ids of this source, e.g. mpe2")
    _add_imports(listing)
    listing.set_defaults(run=_list)

    check = commands.add_parser("check", help="check an env against the env contract")
    _add_env_arguments(check)
    check.add_argument("--steps", type=_int(AT_LEAST_1), default=300, help="steps to play in all")
    check.add_argument(
        "--episodes", type=_int(AT_LEAST_1), default=2, help="episodes to play at most"
    )
    check.add_argument(
        "--step-cap",
        type=_int(AT_LEAST_1),
        default=STEP_CAP,
        help="most steps the first episode may take to end (it plays on past --steps)",
    )
    check.add_argument(
        "--num-envs",
        type=_int(AT_LEAST_1),
        default=NUM_ENVS,
        help="copies of a natively batched env",
    )
    check.add_argument(
        "--native-only",
        action="store_true",
        help="check only the natively batched implementation (still compared with the dict env)",
    )
    check.add_argument(
        "--timeout",
        type=_seconds,
        default=CHECK_TIMEOUT,
        metavar="SECONDS",
        help="most seconds one call of the env (building it, a reset, a step...) may take: "
        "the check, run in a child process, stops an env that hangs longer",
    )
    check.set_defaults(run=_check)

    play = commands.add_parser("play", help="play episodes with random legal actions")
    _add_env_arguments(play)
    play.add_argument("--episodes", type=_int(AT_LEAST_1), default=3, help="episodes to play")
    play.add_argument(
        "--max-steps",
        type=_int(AT_LEAST_1),
        default=10_000,
        help="stop an episode after this many steps",
    )
    play.set_defaults(run=_play)
    _add_training_commands(commands)
    for command in commands.choices.values():
        # a prefix is no flag: `--envs 8` would set --envs-per-runner
        command.allow_abbrev = False
    return parser


def _add_env_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="a registered env id, or module:attr")
    _add_imports(parser)
    parser.add_argument("--seed", type=_int(AT_LEAST_0), default=0, help="seed of the first reset")
    parser.add_argument(
        "--set",
        "--kwargs",
        dest="kwargs",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="keyword arguments of the env: true, false, null, numbers, [lists] or strings",
    )


def _add_settings(parser: argparse.ArgumentParser, text: str) -> None:
    """``--set KEY=VALUE ...`` (repeatable), read into ``settings``."""
    parser.add_argument(
        "--set",
        dest="settings",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help=text,
    )


def parse_kwargs(items: Sequence[str]) -> dict[str, Any]:
    """The env's keyword arguments given as ``--set key=value``
    (see :mod:`corral.settings.grammar`)."""
    try:
        return parse_settings(items)
    except ConfigError as err:
        raise UsageError(str(err)) from None


def _add_imports(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import this module of yours first (it registers env ids with corral.register), "
        "from the current directory or the path; repeatable",
    )


def _import_user_code(args: argparse.Namespace) -> None:
    """Import the modules of ``--import``. The current directory goes on the path only where
    the command line names code of the user's (``--import``, ``--allow-import``, a
    ``module:attr``): a file there is not imported for a run directory's sake."""
    named = [getattr(args, name, None) for name in ("id", "env", "algo")]
    user_code = [*getattr(args, "imports", []), *getattr(args, "allow_imports", [])]
    names_code = user_code or any(isinstance(n, str) and ":" in n for n in named)
    if names_code and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would, for user modules
    try:
        import_modules(getattr(args, "imports", []))
    except RegistrationError as err:
        raise UsageError(str(err)) from err


def build_env(id: str, kwargs: dict[str, Any]) -> Any:
    """The env named by a registered id or by ``module:attr``, built with ``kwargs``."""
    with _usage_errors(id, kwargs):
        return make(id, **kwargs)


@contextlib.contextmanager
def _usage_errors(id: str, kwargs: dict[str, Any]) -> Iterator[None]:
    """Turn the errors of looking up and building ``id`` with ``kwargs`` into one line: a
    :class:`UsageError`."""
    with_kwargs = f" with {kwargs}" if kwargs else ""
    try:
        yield
    except (UnknownEnvError, MissingDependencyError, RegistrationError) as err:
        raise UsageError(str(err)) from err
    except Exception as err:  # the env's module or constructor failed, in its own words
        said = " ".join(str(err).split())
        raise UsageError(
            f"cannot build {id!r}{with_kwargs}: {type(err).__name__}: {said}{_raised_at(err)}"
        ) from err


def _raised_at(err: BaseException) -> str:
    """`` (raised at FILE:LINE)``: where ``err`` was raised, in place of its traceback."""
    frames = traceback.extract_tb(err.__traceback__)
    return f" (raised at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _list(args: argparse.Namespace) -> int:
    try:
        ids = registered_ids(args.source)  # installed packages' too
    except RegistrationError as err:  # a package's entry point that cannot be loaded
        raise UsageError(str(err)) from err
    prefixes = [p for p in namespaces() if args.source in (None, p)]
    if not ids and not prefixes:
        sources = sorted({i.split("/")[0] for i in registered_ids()} | set(namespaces()))
        raise UsageError(f"no env of source {args.source!r}; sources: {', '.join(sources)}")
    for source, group in groupby(ids, key=lambda i: i.split("/")[0]):
        members = list(group)
        print(f"{source} ({len(members)})")
        for id in members:
            native = "  (natively batched)" if spec(id).batched is not None else ""
            print(f"  {id}{native}{_extra_note(spec(id).extra)}")
    for prefix in prefixes:
        note = _extra_note(namespace(prefix).extra)
        print(f"{prefix}/<name>  (namespace: any name that {prefix} knows){note}")
    return 0


def _extra_note(extra: str | None) -> str:
    if extra is None or not _extra_missing(extra):
        return ""
    return f"  [not installed: pip install 'corral[{extra}]']"


@functools.cache
def _extra_missing(extra: str, of: str = "corral") -> bool:
    """Whether a distribution that ``of[extra]`` requires is not installed, or, where the
    ``packaging`` library is there to read requirements, one that a requirement
    ``dist[inner]`` requires for ``inner`` (``pettingzoo[sisl]``: pymunk).

    Reads installed metadata only, so listing never imports an optional package.
    """
    try:
        requirements = importlib.metadata.requires(of) or []
    except importlib.metadata.PackageNotFoundError:
        return False
    try:
        from packaging import requirements as reading
    except ImportError:  # not one of corral's own dependencies: the top level only
        reading = None  # type: ignore[assignment]
    for requirement in requirements:
        name, _, marker = requirement.partition(";")
        if reading is not None:
            parsed = reading.Requirement(requirement)
            if parsed.marker is None or not parsed.marker.evaluate({"extra": extra}):
                continue
            dist, inner = parsed.name, sorted(parsed.extras)
        else:
            if not re.search(rf"extra\s*==\s*['\"]{re.escape(extra)}['\"]", marker):
                continue
            found = re.match(r"\s*[A-Za-z0-9._-]+", name)
            dist, inner = (found.group(0).strip() if found else ""), []
        if not dist or dist in ("corral", of):
            continue
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            return True
        if any(_extra_missing(e, dist) for e in inner):
            return True
    return False


def _check(args: argparse.Namespace) -> int:
    kwargs = parse_kwargs(args.kwargs)
    # Each step in a child process: an env that hangs (its module's import too) or ends its
    # process stops its own check.
    found: list[tuple[bool, bool]] = []
    if not _watched(args, functools.partial(_find_kinds, args, kwargs), found.append):
        return 1
    (has_dict, has_native) = found[0]
    if args.native_only and not has_native:
        ids = ", ".join(batched_ids()) or "none"
        raise UsageError(
            f"{args.id!r} has no natively batched implementation; those that do: {ids}"
        )
    kinds = [_NATIVE] if has_native else []
    if has_dict and not args.native_only:
        kinds.insert(0, _DICT)
    reports: list[CheckReport] = []
    stopped = False

    def take(report: CheckReport) -> None:
        print(report)
        reports.append(report)

    for kind in kinds:
        if not _watched(args, functools.partial(_check_kind, args, kwargs, kind), take):
            stopped = True
    if stopped or not all(report.ok for report in reports):
        return 1
    return 0 if all(report.complete for report in reports) else 3


def _watched(args: argparse.Namespace, work: Any, take: Callable[[Any], Any]) -> bool:
    """Run ``work`` watched (:func:`run_watched`), ``take`` each value it sends; whether it
    finished (else it said that the env hung or ended its process)."""
    try:
        for tag, value in run_watched(work, args.timeout):
            if tag == "usage":
                raise UsageError(value)
            take(value)
    except WorkHung as err:
        print(f"{args.id}: the env {err}; the check stopped it (--timeout sets the limit)")
        return False
    except WorkExited as err:
        print(f"{args.id}: the env's process {err}; the check stopped there")
        return False
    return True


def _find_kinds(args: argparse.Namespace, kwargs: dict[str, Any], send: Any, note: Any) -> None:
    """In a child process of :func:`_check`: send whether ``args.id`` has a dict env and a
    natively batched one (``("kinds", (bool, bool))``), found by importing its code."""
    try:
        note(f"importing the code of {args.id}")
        _import_user_code(args)
        dict_env, native = _implementations(args.id, kwargs)
        send(("kinds", (dict_env is not None, native is not None)))
    except UsageError as err:
        send(("usage", str(err)))


_DICT, _NATIVE = "dict env", "batched env"


def _check_kind(
    args: argparse.Namespace, kwargs: dict[str, Any], kind: str, send: Any, note: Any
) -> None:
    """Check the ``kind`` of implementation of ``args.id``, in the child process of
    :func:`_check`: send each report (``("report", report)``), or ``("usage", message)``
    where the env cannot be built; ``note`` each step that may hang."""
    try:
        _import_user_code(args)  # a spawned child imports them again
        if kind == _DICT:
            note(f"building the env ({kind})")
            env = build_env(args.id, kwargs)
            send(("report", _check_one(args, env, note, kind)))
            return
        dict_env, native = _implementations(args.id, kwargs)
        for array, device in _native_places():  # imports torch before the first note
            where = f"{kind}, {array}" + (f" on {device}" if array == "torch" else "")
            note(f"building the env ({where})")
            with _usage_errors(args.id, kwargs):
                env = native(num_envs=args.num_envs, array=array, device=device, **kwargs)
            send(("report", _check_one(args, env, note, where, dict_env=dict_env)))
    except UsageError as err:
        send(("usage", str(err)))


def _implementations(id: str, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """A function of no arguments building the dict env of ``id``, and the entry point of its
    natively batched implementation; ``None`` for the one it lacks. A ``module:attr`` is one
    or the other (a :class:`corral.BatchedEnv` subclass is batched)."""
    with _usage_errors(id, kwargs):
        found = spec(id)
    dict_env = functools.partial(make, id, **kwargs) if found.entry_point else None
    return dict_env, found.make_batched if found.batched else None


def _check_one(
    args: argparse.Namespace, env: Any, note: Any, where: str, **options: Any
) -> CheckReport:
    try:
        with warnings.catch_warnings(), reporting_calls(lambda call: note(f"{call} ({where})")):
            warnings.simplefilter("ignore", CheckIncompleteWarning)  # the report says it
            report = check_env(
                env,
                seed=args.seed,
                max_steps=args.steps,
                episodes=args.episodes,
                step_cap=args.step_cap,
                raise_on_error=False,
                **options,
            )
    finally:
        note(f"env.close() ({where})")
        env.close()
    report.env = args.id
    return report


def _native_places() -> list[tuple[str, str]]:
    """Where ``corral check`` plays a natively batched env: numpy, and torch where installed
    (on the CPU, and on a GPU where torch sees one)."""
    places = [("numpy", "cpu")]
    if importlib.util.find_spec("torch") is not None:
        import torch

        places.append(("torch", "cpu"))
        if torch.cuda.is_available():
            places.append(("torch", "cuda"))
    return places


def _play(args: argparse.Namespace) -> int:
    env = build_env(args.id, parse_kwargs(args.kwargs))
    policy = RandomPolicy(env, args.seed)
    totals: dict[Any, list[float]] = {}
    try:
        for episode in range(args.episodes):
            returns, length = play_episode(env, policy, args.seed + episode, args.max_steps)
            for agent, value in returns.items():
                totals.setdefault(agent, []).append(value)
            cut = "" if not env.agents else f" (stopped: still running after {length} steps)"
            print(f"episode {episode}: length {length}, returns {_format(returns)}{cut}")
    finally:
        env.close()
    means = {agent: sum(values) / len(values) for agent, values in totals.items()}
    print(f"mean returns over {args.episodes} episode(s): {_format(means)}")
    return 0


def play_episode(
    env: Any, policy: RandomPolicy, seed: int, max_steps: int
) -> tuple[dict[Any, float], int]:
    """Play one episode from ``reset(seed)``; the return of every agent and the length."""
    obs, infos = env.reset(seed=seed)
    returns = dict.fromkeys(env.possible_agents, 0.0)
    length = 0
    while env.agents and length < max_steps:
        obs, rewards, _, _, infos = env.step(policy(obs, infos))
        for agent, reward in rewards.items():
            returns[agent] = returns.get(agent, 0.0) + float(reward)
        length += 1
    return returns, length


def _format(values: dict[Any, float]) -> str:
    return ", ".join(f"{agent}={value:+.3g}" for agent, value in values.items())


# -- training: corral.training is imported only by these commands --------------------------


def _add_training_commands(commands: Any) -> None:
    train = commands.add_parser(
        "train", help="train an algorithm on an env (corral[train])", add_help=False
    )
    train.add_argument(
        "-h",
        "--help",
        action="store_true",
        help="show this help, then every run setting and ALGO's: type, default, range and "
        "what it does (with --env ID, the defaults for that env)",
    )
    train.add_argument("algo", nargs="?", help=f"{_ALGOS}, or module:attr")
    train.add_argument("--env", metavar="ID", help="a registered env id, or module:attr")
    train.add_argument(
        "--resume", metavar="RUN", help="continue the run in this directory (its ALGO and env)"
    )
    for flag, metavar, text in (
        ("--num-envs", "N", "envs stepped in parallel"),
        ("--backend", "NAME", "vector backend: sync, subproc or ray"),
        ("--total-steps", "N", "env steps to train for (2e6 is fine)"),
        ("--seed", "S", "seed of envs, algorithm and generators"),
        ("--device", "DEVICE", "cpu, cuda or auto"),
        ("--run-dir", "DIR", "where the run writes (default runs/<algo>-<env>-s<seed>-<time>)"),
        (
            "--runners",
            "N",
            "rollout workers: Ray actors that collect rollouts for the learners",
        ),
        ("--envs-per-runner", "M", "envs of each rollout worker (default: num_envs split)"),
        ("--ray-address", "ADDRESS", "the Ray cluster to join (backend ray, or runners)"),
    ):
        setting = flag[2:].replace("-", "_")
        train.add_argument(flag, dest=setting, metavar=metavar, help=text)
    train.add_argument(
        "--self-play",
        dest="self_play",
        action="store_const",
        const="true",
        help="learn a zero-sum game against snapshots of itself (dqn, mappo, ippo; the env "
        "must declare metadata zero_sum=True)",
    )
    train.add_argument(
        "--policies",
        metavar="MAP",
        help="which policy plays which group or agent, e.g. 'adversary=mappo,agent=ippo' or "
        "'agent=fixed:random' (agents named nowhere are learned by ALGO)",
    )
    _add_settings(
        train, "any run or algorithm setting (env_kwargs.N=3 sets one env keyword argument)"
    )
    train.add_argument("--no-progress", action="store_true", help="log lines, no progress bar")
    _add_imports(train)
    _add_allow_import(train)
    train.set_defaults(run=_train, format_help=train.format_help)

    sweep = commands.add_parser(
        "sweep", help="search an algorithm's settings with Optuna (corral[track])"
    )
    sweep.add_argument("algo", help=f"{_ALGOS}, or module:attr")
    sweep.add_argument("--env", metavar="ID", required=True, help="a registered env id")
    sweep.add_argument(
        "--space",
        metavar="FILE",
        required=True,
        help="YAML file of the settings to search: NAME: {low: L, high: H} (log: true, "
        "step: S) or NAME: {choices: [...]}",
    )
    sweep.add_argument("--trials", type=_int(AT_LEAST_1), required=True, help="trials to run")
    sweep.add_argument(
        "--parallel", type=_int(AT_LEAST_1), default=1, help="trials running at once"
    )
    sweep.add_argument(
        "--backend",
        choices=("process", "ray"),
        default="process",
        help="where parallel trials run: worker processes, or Ray tasks (not the envs' "
        "vector backend: --set backend=subproc sets that)",
    )
    sweep.add_argument(
        "--sweep-dir",
        metavar="DIR",
        help="where the study (study.db), the trials' run directories and best.yaml go; a "
        "sweep dir that holds a study continues it (default runs/sweep-<algo>-<env>-<time>)",
    )
    sweep.add_argument(
        "--pruner",
        choices=("median", "none"),
        default="median",
        help="stop trials whose evaluations fall below the median of finished ones",
    )
    for flag, metavar, text in (
        ("--total-steps", "N", "env steps each trial trains for"),
        ("--seed", "S", "seed of every trial"),
        ("--num-envs", "N", "envs stepped in parallel in each trial"),
        ("--device", "DEVICE", "cpu, cuda or auto"),
    ):
        sweep.add_argument(flag, dest=flag[2:].replace("-", "_"), metavar=metavar, help=text)
    _add_settings(sweep, "a run or algorithm setting of every trial")
    _add_imports(sweep)
    _add_allow_import(sweep)
    sweep.set_defaults(run=_sweep)

    evaluate = commands.add_parser("eval", help="evaluate a run's best (or latest) checkpoint")
    evaluate.add_argument("run_dir", metavar="RUN", help="a run directory")
    evaluate.add_argument("--episodes", type=_int(AT_LEAST_1), default=20, help="episodes to play")
    evaluate.add_argument(
        "--explore",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="play the policies exploring, as in training (default: the run's eval_explore, "
        "greedy unless set)",
    )
    evaluate.add_argument("--checkpoint", choices=("best", "latest"), default="best")
    evaluate.add_argument(
        "--seed", type=_int(SEED), help="seed of the episodes (default: the run's)"
    )
    evaluate.add_argument("--device", help="cpu, cuda or auto (default: the run's)")
    evaluate.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="the Ray cluster to evaluate on, for a run on backend ray: one that the run's "
        "config.yaml names is joined only where this names it again",
    )
    evaluate.add_argument(
        "--opponent",
        metavar="OPPONENT",
        help="also play against this reference from each learned seat: random, or a run "
        "directory or checkpoint (default: the run's eval_opponent, in zero-sum games only)",
    )
    evaluate.add_argument(
        "--policies",
        metavar="MAP",
        help="play groups or agents by other policies, e.g. 'agent=runs/OTHER:agent' (another "
        "run's policy, greedy) or 'agent=fixed:random'",
    )
    evaluate.add_argument("--gif", metavar="PATH", help="also record one episode as a GIF")
    evaluate.add_argument(
        "--baselines",
        action="store_true",
        help="also score the env's reference baselines (random and a scripted heuristic, where "
        "corral has them) on the same measure and episodes",
    )
    _add_imports(evaluate)
    _add_allow_import(evaluate)
    evaluate.set_defaults(run=_eval)

    plot = commands.add_parser("plot", help="plot an evaluation column against env steps")
    plot.add_argument("run_dirs", metavar="RUN", nargs="+", help="run directories")
    plot.add_argument("-o", "--output", default="curves.png", help="image file to write")
    plot.add_argument("--band", choices=("minmax", "std"), default="minmax")
    plot.add_argument(
        "--metric",
        metavar="COLUMN",
        help="the metrics.csv column to plot, e.g. eval_return or eval_return/predator "
        "(default: each run's select_by column, the one its best.pt was chosen on: "
        "eval_vs_opponent in self-play and two-player zero-sum games, else eval_return)",
    )
    plot.add_argument(
        "--reference",
        dest="references",
        action="append",
        type=_reference,
        default=[],
        metavar="NAME=VALUE",
        help="draw a labelled horizontal line at VALUE (repeat for several)",
    )
    plot.add_argument(
        "--baselines",
        action="store_true",
        help="also draw the reference baselines of each run's env (random and a scripted "
        "heuristic, on mpe2/simple_spread_v3), measured on eval_return",
    )
    plot.set_defaults(run=_plot)


AT_LEAST_0, AT_LEAST_1 = Range(ge=0), Range(ge=1)

CHECK_TIMEOUT = 60.0
"""Default of ``corral check --timeout``: most seconds one call of the env may take."""


def _seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _int(limits: Range) -> Any:
    """An argparse type: an int within ``limits``; argparse names the argument it refuses."""

    def read(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value not in limits:
            raise argparse.ArgumentTypeError(f"must be {limits}, got {value}")
        return value

    return read


def _reference(text: str) -> tuple[str, float]:
    """``NAME=VALUE`` of ``--reference`` as ``(name, value)``."""
    name, _, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = None
    if not name or number is None or not math.isfinite(number):
        raise argparse.ArgumentTypeError(
            f"expected NAME=VALUE with a finite number VALUE, got {text!r}"
        )
    return name, number


def _add_allow_import(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-import",
        dest="allow_imports",
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="let a run directory's config.yaml (its algo, opponent or env, or those of "
        "eval_opponent's run) import exactly this module:attr, or this module of its imports "
        "(as --import does); repeatable. Without it, such a config may name only registered "
        "algorithms and envs",
    )


_SETTING_FLAGS = (
    "num_envs",
    "backend",
    "total_steps",
    "seed",
    "device",
    "run_dir",
    "self_play",
    "runners",
    "envs_per_runner",
    "ray_address",
)
SETTING_OPTIONS = {
    "env": "--env",
    "imports": "--import",
    "policies": "--policies",
    **{name: "--" + name.replace("_", "-") for name in _SETTING_FLAGS},
}
"""The settings that ``corral train`` also takes as an option of its own, and that option."""


def _refuse_disagreeing(settings: dict[str, Any], flags: dict[str, Any]) -> None:
    """A :class:`UsageError` where ``--set NAME=VALUE`` and the option of the same setting
    (``--total-steps``) give it different values: neither silently wins. An option's text
    is read as ``--set`` reads a value."""
    for name, value in flags.items():
        if name in settings and settings[name] != parse_value(value):
            option = SETTING_OPTIONS[name]
            raise UsageError(
                f"{option} {value} and --set {name}={settings[name]} disagree: give one of them"
            )


def _train(args: argparse.Namespace) -> int:
    from corral.training import Runner, TrainConfig, load_config
    from corral.training.policy_map import parse_policies
    from corral.training.runner import AlreadyTrainedError

    if args.help:
        print(_train_help(args))
        return 0
    overrides: dict[str, Any] = {}
    config: TrainConfig | None = None
    try:
        with _training_errors():
            overrides.update(parse_settings(args.settings))
            flags = {k: getattr(args, k) for k in _SETTING_FLAGS if getattr(args, k) is not None}
            _refuse_disagreeing(overrides, flags)
            overrides.update(flags)
            if args.policies is not None:
                overrides["policies"] = parse_policies(args.policies)
            progress, allowed = not args.no_progress, [*args.allow_imports, *args.imports]
            if args.resume and args.algo:
                raise UsageError(
                    f"--resume takes the algorithm from {args.resume}/config.yaml: "
                    f"leave out {args.algo!r}"
                )
            if args.resume and args.env:
                raise UsageError(
                    f"--resume takes the env from {args.resume}/config.yaml: "
                    f"leave out --env {args.env}"
                )
            if args.resume:
                try:
                    runner = Runner.resume(
                        args.resume,
                        progress=progress,
                        allow_imports=allowed,
                        imports=args.imports,
                        **overrides,
                    )
                except AlreadyTrainedError as done:  # asked for what the run already has
                    print(
                        f"run {done.run_dir} already has {done.env_steps} env steps "
                        f"(total_steps {done.total_steps}): nothing to do, nothing changed; "
                        f"--total-steps above {done.env_steps} trains it on"
                    )
                    return 0
            elif not args.algo or not args.env:
                raise UsageError("give ALGO and --env ID, or --resume RUN")
            else:
                if args.imports:
                    overrides["imports"] = [*_modules(overrides.get("imports")), *args.imports]
                config = load_config(args.algo, args.env, overrides)
                runner = Runner(config, progress=progress, allow_imports=allowed)
        with _console_logging(), runner:
            results = runner.train()
    except (CheckpointError, ConfigError) as err:  # a run file or eval_opponent, changed meanwhile
        raise UsageError(str(err)) from err
    except UnsupportedEnvError as err:  # found while training, on an env that did not declare it
        raise UsageError(str(err)) from err
    except (EnvError, WorkerTimeoutError) as err:  # an env's fault, with on_env_error=raise
        run_dir = args.resume or (config.run.run_dir if config is not None else None)
        print(f"corral: error: training stopped: {err}", file=sys.stderr)
        print(
            f"{_resume_advice(run_dir)}; `--set on_env_error=restart` restarts a faulty env "
            "and trains on",
            file=sys.stderr,
        )
        return 1
    except EvaluationError as err:  # on_env_error=restart, and faults cut too many episodes
        run_dir = args.resume or (config.run.run_dir if config is not None else None)
        print(f"corral: error: training stopped: {err}", file=sys.stderr)
        print(_resume_advice(run_dir), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # a new run's directory is named in its config once the runner has made it
        run_dir = args.resume or (config.run.run_dir if config is not None else None)
        print(_interrupted(run_dir), file=sys.stderr)
        return 130
    best = "-" if results.best_eval is None else f"{results.best_eval:.4g}"
    print(f"run {results.run_dir}: {results.env_steps} env steps, best {results.select_by} {best}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from corral.training.sweep import default_sweep_dir, sweep

    sweep_dir = args.sweep_dir or str(default_sweep_dir(args.algo, args.env))
    with _training_errors():
        settings = parse_settings(args.settings)
        names = ("total_steps", "seed", "num_envs", "device")
        flags = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
        _refuse_disagreeing(settings, flags)
        settings.update(flags)
        if args.imports:
            settings["imports"] = [*_modules(settings.get("imports")), *args.imports]
        try:
            result = sweep(
                args.algo,
                args.env,
                args.space,
                args.trials,
                settings=settings,
                sweep_dir=sweep_dir,
                parallel=args.parallel,
                backend=args.backend,
                pruner=args.pruner,
                allow_imports=[*args.allow_imports, *args.imports],
                echo=True,
            )
        except (EnvError, WorkerTimeoutError, EvaluationError) as err:
            print(f"corral: error: a trial stopped the sweep: {err}", file=sys.stderr)
            print(f"the same command with --sweep-dir {sweep_dir} continues it", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(
                f"interrupted: the same command with --sweep-dir {sweep_dir} continues the sweep",
                file=sys.stderr,
            )
            return 130
    trials = ", ".join(f"{count} {state.lower()}" for state, count in result.states.items())
    print(f"sweep {result.sweep_dir}: {trials}")
    print(f"best trial {result.trial}: {result.value:.4g} in {result.run_dir}")
    for name, value in result.settings.items():
        said = ",".join(map(str, value)) if isinstance(value, list) else value
        print(f"  {name}={said}")
    print(f"wrote {result.sweep_dir / 'best.yaml'}")
    return 0


def _train_help(args: argparse.Namespace) -> str:
    """``corral train --help``: argparse's help, then the run settings and ALGO's, each with
    its type, effective default, range and docstring."""
    from corral.settings import list_settings
    from corral.training import RunConfig
    from corral.training.config import effective_defaults

    width = shutil.get_terminal_size().columns - 2  # as argparse's help
    notes = {name: f"also {option}" for name, option in SETTING_OPTIONS.items()}
    if args.resume is not None and args.algo is None:
        return _resume_help(args, notes, width)
    if args.algo is None:
        text = (
            "Settings, given with --set KEY=VALUE (in Python, keyword arguments of "
            "corral.train). Defaults of corral.training.RunConfig; an algorithm's packaged "
            "config changes some: corral train ALGO --help lists them, and ALGO's settings "
            f"(ALGO: {_ALGOS} or module:attr; with --env ID, the defaults for that env)."
        )
        listing = list_settings(RunConfig, {}, notes=notes, width=width)
        return "\n".join(
            [args.format_help(), *textwrap.wrap(text, width), "", "run settings:", listing]
        )
    with _training_errors():
        if args.env:
            spec(args.env)  # a misspelt id is the error train gives, not another env's defaults
        defaults = effective_defaults(args.algo, args.env)
    config_cls = type(defaults.algo_config)
    applied = "the config dataclasses'"
    if defaults.file is not None:
        applied += f", then {defaults.file}'s top level"
        if defaults.sections:
            said = ", ".join(repr(key) for key in defaults.sections)
            applied += f", then its envs: sections {said} (for --env {args.env})"
        elif args.env:
            applied += f"; none of its envs: sections matches --env {args.env}"
        else:
            applied += (
                f"; none of its envs: sections, which apply to an env: corral train "
                f"{args.algo} --env ID --help shows the defaults for ID"
            )
    text = (
        "Settings, given with --set KEY=VALUE (in Python, keyword arguments of corral.train). "
        f"Defaults: {applied}."
    )
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    algo_notes = {
        f.name: "; ".join(
            ([notes[f.name]] if f.name in notes else [])
            + (["sets the run's too"] if f.name in run_fields else [])
        )
        for f in dataclasses.fields(config_cls)
        if f.name in notes or f.name in run_fields
    }
    return _settings_help(
        args, text, width, (defaults.run, notes), (args.algo, defaults.algo_config, algo_notes)
    )


def _resume_help(args: argparse.Namespace, notes: dict[str, str], width: int) -> str:
    """``corral train --resume RUN --help``: the run's settings as its config.yaml holds
    them, saying which a resume may change."""
    from corral.training import RunConfig
    from corral.training.runner import RESUMABLE, read_run_config

    with _training_errors():
        config = read_run_config(Path(args.resume), [*args.allow_imports, *args.imports])
    run_notes = {
        f.name: "; ".join(
            ([notes[f.name]] if f.name in notes else [])
            + (["may change on resume"] if f.name in RESUMABLE else ["fixed by the run"])
        )
        for f in dataclasses.fields(RunConfig)
    }
    text = (
        f"Settings of the run in {args.resume}, as its config.yaml holds them. A resume may "
        f"change those marked so (--set KEY=VALUE); the others, and {config.algo}'s "
        "settings, are fixed by the run."
    )
    return _settings_help(
        args, text, width, (config.run, run_notes), (config.algo, config.algo_config, {})
    )


def _settings_help(
    args: argparse.Namespace,
    text: str,
    width: int,
    run: tuple[Any, dict[str, str]],
    algo: tuple[str, Any, dict[str, str]],
) -> str:
    """argparse's help, ``text``, then the run settings ``run`` (values, notes) and the
    algorithm's ``algo`` (name, values, notes), each listed with type, range and docstring."""
    from corral.settings import list_settings
    from corral.training import RunConfig

    (run_values, run_notes), (name, algo_values, algo_notes) = run, algo
    cls = type(algo_values)
    return "\n".join(
        [
            args.format_help(),
            *textwrap.wrap(text, width),
            "",
            "run settings (corral.training.RunConfig):",
            list_settings(RunConfig, vars(run_values), notes=run_notes, width=width),
            "",
            f"{name} settings ({cls.__module__}.{cls.__qualname__}):",
            list_settings(cls, vars(algo_values), notes=algo_notes, width=width),
        ]
    )


def _modules(setting: Any) -> list[str]:
    """The modules of an ``imports`` setting given with ``--set`` (none where unset)."""
    from corral.training.config import coerce

    if setting is None:
        return []
    try:
        return list(coerce(setting, tuple[str, ...]))
    except (TypeError, ValueError) as err:
        raise UsageError(f"setting imports={setting!r}: {err}") from None


def _interrupted(run_dir: str | None) -> str:
    from corral.training.runner import LATEST

    if run_dir and os.path.isfile(os.path.join(run_dir, LATEST)):
        return f"interrupted: resume from the last checkpoint with corral train --resume {run_dir}"
    return "interrupted before the first checkpoint: nothing to resume"


def _resume_advice(run_dir: str | None) -> str:
    """How to go on from ``run_dir``: its latest checkpoint, where one was written."""
    from corral.training.runner import LATEST

    if run_dir and os.path.isfile(os.path.join(run_dir, LATEST)):
        return (
            f"{LATEST} in {run_dir} holds the last checkpoint: `corral train --resume "
            f"{run_dir}` goes on from it"
        )
    return f"no checkpoint was written in {run_dir}: there is nothing to resume"


def _eval(args: argparse.Namespace) -> int:
    from corral.training import ConfigError
    from corral.training.config import replace_run
    from corral.training.policy_map import check_value, is_fixed, parse_policies
    from corral.training.render import RenderError, record_episode
    from corral.training.runner import BEST, check_cluster, evaluate_policy, load_run
    from corral.training.scoring import RETURN, VERSUS
    from corral.training.threads import set_torch_threads, torch_threads

    allowed = [*args.allow_imports, *args.imports]
    with _training_errors():
        config, algo, saved = load_run(
            args.run_dir, args.checkpoint, device=args.device, allow_imports=allowed
        )
        if args.policies is not None:
            given = parse_policies(args.policies)
            for key, value in given.items():
                check_value(key, value)
                if not is_fixed(value):
                    raise UsageError(
                        f"--policies {key}={value}: corral eval plays the run's own learners; "
                        "it gives agents to fixed:random, fixed:MODULE:ATTR or another run's "
                        f"policy RUN_DIR:POLICY, and {value!r} is none of these"
                    )
            config.run = replace_run(config.run, policies={**config.run.policies, **given})
        named = args.ray_address is not None
        check_cluster(config, Path(args.run_dir), named, "corral eval", "--ray-address ")
        if named:
            config.run = replace_run(config.run, ray_address=args.ray_address)
        if args.explore is not None:
            config.run = replace_run(config.run, eval_explore=args.explore)
    if args.baselines:  # an env with none is refused before the evaluation, not after
        from corral.training.baselines import baselines_of

        try:
            baselines_of(config.run.env)
        except ValueError as err:
            raise UsageError(str(err)) from err
    set_torch_threads(torch_threads(config.run.torch_threads))
    try:
        result = evaluate_policy(
            config,
            algo,
            args.episodes,
            seed=args.seed,
            opponent=args.opponent,
            allow_imports=allowed,
        )
    except (ConfigError, CheckpointError) as err:  # an --opponent that cannot be used
        raise UsageError(str(err)) from err
    except EvaluationError as err:  # faults cut more episodes than it replaces
        print(f"corral: error: {err}", file=sys.stderr)
        return 1
    cut = f" ({result.cut} cut by faults, played again)" if result.cut else ""
    # "best" falls back to the latest checkpoint where no evaluation has saved one yet
    which = (
        "best"
        if args.checkpoint == "best" and os.path.isfile(os.path.join(args.run_dir, BEST))
        else "latest"
    )
    how = "exploring" if config.run.eval_explore else "greedy"
    print(
        f"{args.run_dir} ({which} checkpoint, {saved['env_steps']} env steps, {how}): "
        f"mean +- standard error over {args.episodes} episodes{cut}"
    )
    columns = result.columns()

    def parts(prefix: str) -> str:
        found = {k.removeprefix(prefix): v for k, v in columns.items() if k.startswith(prefix)}
        return ", ".join(f"{name} {value:+.4g}" for name, value in found.items())

    lines = {RETURN: f"; by group and agent: {parts(RETURN + '/')}"}
    if VERSUS in columns:
        against = args.opponent or config.run.eval_opponent
        lines[VERSUS] = f" against {against}; by seat: {parts(VERSUS + '/')}"
    first = result.metric  # the run's select_by: the measure its best.pt was chosen on
    lines = {first: " (selects best.pt)" + lines.get(first, "")} | {
        k: v for k, v in lines.items() if k != first
    }
    for column, text in lines.items():
        print(f"  {column} {result.score(column)}{text}")
    if args.baselines:
        _print_baselines(config, args.episodes, args.seed)
    if args.gif:
        seed = 0 if args.seed is None else args.seed
        try:
            frames = record_episode(config, algo, args.gif, seed=seed)
        except RenderError as err:
            print(f"no GIF written: {err}", file=sys.stderr)
        else:
            print(f"wrote {args.gif} ({frames} frames)")
    return 0


def _print_baselines(config: Any, episodes: int, seed: int | None) -> None:
    """The reference baselines of a run's env, scored as its evaluation is."""
    from corral.training.baselines import reference_scores
    from corral.training.scoring import RETURN

    run = config.run
    try:
        scores = reference_scores(
            run.env, run.env_kwargs, episodes=max(episodes, 2), seed=seed or 0
        )
    except ValueError as err:
        raise UsageError(str(err)) from err
    found = ", ".join(f"{name} {score}" for name, score in scores.items())
    over = "" if episodes >= 2 else " (over 2 episodes: a standard error needs two)"
    print(f"  reference baselines on {RETURN}{over}: {found}")


def _plot(args: argparse.Namespace) -> int:
    from corral.training.plot import plot_runs

    with _training_errors():
        path = plot_runs(
            args.run_dirs,
            args.output,
            band=args.band,
            metric=args.metric,
            references=dict(args.references),
            baselines=args.baselines,
        )
    print(f"wrote {path}")
    return 0


@contextlib.contextmanager
def _training_errors() -> Iterator[None]:
    """Settings, runs and extras that cannot be used are usage errors, shown without traceback."""
    from corral.training import ConfigError

    try:
        yield
    except (ConfigError, MissingDependencyError, UnknownEnvError, RegistrationError) as err:
        raise UsageError(str(err)) from err
    except WorkerStartError as err:  # workers the cluster cannot hold, as configured
        raise UsageError(str(err)) from err
    except (ValueError, TypeError) as err:  # unknown algorithm, env kwargs, unsupported spaces
        raise UsageError(str(err)) from err
    except EnvError as err:  # the envs cannot be built or reset: no training has begun
        raise UsageError(_fault_line(err)) from err


def _fault_line(err: EnvError) -> str:
    """An env's fault in one line: its message without the env's traceback, and where the env
    raised (the traceback's last frame)."""
    head, _, trace = str(err).partition("\n\nTraceback")
    frames = re.findall(r'File "(.+)", line (\d+)', trace)
    where = f" (raised at {frames[-1][0]}:{frames[-1][1]})" if frames else ""
    return " ".join(head.split()) + where


@contextlib.contextmanager
def _console_logging() -> Iterator[None]:
    """corral's log records (progress lines, evaluations) go to stderr while a command runs."""
    logger = logging.getLogger("corral")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
