"""The ``corral`` command line: list the registered envs, check one, play one at random.

    corral list [SOURCE]
    corral check ID [--seed S] [--steps N] [--set key=value ...]
    corral play ID [--episodes N] [--seed S] [--set key=value ...]

``ID`` is a registered id (``mpe2/simple_spread_v3``) or an entry point
``module:attr`` (``examples.custom_env:Nim``, importable from the current
directory). Exit codes: 0 success, 1 contract violations, 2 an id, source or
argument that cannot be used.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.metadata
import os
import re
import sys
from collections.abc import Sequence
from itertools import groupby
from typing import Any

from corral.checker import RandomPolicy, check_env
from corral.errors import MissingDependencyError, RegistrationError, UnknownEnvError
from corral.registry import make, namespaces, registered_ids, resolve, spec


class UsageError(Exception):
    """A command line that cannot be carried out; its message is shown without a traceback."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (``sys.argv[1:]`` by default); returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except UsageError as err:
        print(f"corral: error: {err}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="corral", description="Multi-agent RL envs under one contract."
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="list the registered env ids")
    listing.add_argument("source", nargs="?", help="only the ids of this source, e.g. mpe2")
    listing.set_defaults(run=_list)

    check = commands.add_parser("check", help="check an env against the env contract")
    _add_env_arguments(check)
    check.add_argument("--steps", type=int, default=300, help="steps to play in all")
    check.add_argument("--episodes", type=int, default=2, help="episodes to play at most")
    check.set_defaults(run=_check)

    play = commands.add_parser("play", help="play episodes with random legal actions")
    _add_env_arguments(play)
    play.add_argument("--episodes", type=int, default=3, help="episodes to play")
    play.add_argument(
        "--max-steps", type=int, default=10_000, help="stop an episode after this many steps"
    )
    play.set_defaults(run=_play)
    return parser


def _add_env_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="a registered env id, or module:attr")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first reset")
    parser.add_argument(
        "--set",
        "--kwargs",
        dest="kwargs",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="keyword arguments of the env; values are Python literals or strings",
    )


def parse_kwargs(items: Sequence[str]) -> dict[str, Any]:
    """``["n=3", "mode=fast"]`` -> ``{"n": 3, "mode": "fast"}``: literals when they parse."""
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"expected KEY=VALUE with KEY a Python name, got {item!r}")
        try:
            kwargs[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            kwargs[key] = text
    return kwargs


def build_env(id: str, kwargs: dict[str, Any]) -> Any:
    """The env named by a registered id or by ``module:attr``, built with ``kwargs``."""
    from corral.adapters import adapt

    try:
        if ":" in id:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())  # as `python -m` would, for user modules
            return adapt(resolve(id)(**kwargs))
        return make(id, **kwargs)
    except (UnknownEnvError, MissingDependencyError, RegistrationError) as err:
        raise UsageError(str(err)) from err
    except (ImportError, AttributeError) as err:
        raise UsageError(f"cannot load {id!r}: {err}") from err
    except TypeError as err:
        raise UsageError(f"cannot build {id!r} with {kwargs}: {err}") from err


def _list(args: argparse.Namespace) -> int:
    ids = registered_ids(args.source)
    prefixes = [p for p in namespaces() if args.source in (None, p)]
    if not ids and not prefixes:
        sources = sorted({i.split("/")[0] for i in registered_ids()} | set(namespaces()))
        raise UsageError(f"no env of source {args.source!r}; sources: {', '.join(sources)}")
    for source, members in groupby(ids, key=lambda i: i.split("/")[0]):
        members = list(members)
        print(f"{source} ({len(members)})")
        for id in members:
            print(f"  {id}{_extra_note(spec(id).extra)}")
    for prefix in prefixes:
        note = _extra_note(spec(f"{prefix}/<name>").extra)
        print(f"{prefix}/<name>  (namespace: any name that {prefix} knows){note}")
    return 0


def _extra_note(extra: str | None) -> str:
    if extra is None or not _extra_missing(extra):
        return ""
    return f"  [not installed: pip install 'corral[{extra}]']"


@functools.cache
def _extra_missing(extra: str) -> bool:
    """Whether a distribution that ``corral[extra]`` requires is not installed.

    Reads installed metadata only, so listing never imports an optional package.
    """
    try:
        requirements = importlib.metadata.requires("corral") or []
    except importlib.metadata.PackageNotFoundError:
        return False
    for requirement in requirements:
        name, _, marker = requirement.partition(";")
        if not re.search(rf"extra\s*==\s*['\"]{re.escape(extra)}['\"]", marker):
            continue
        dist = re.match(r"[A-Za-z0-9._-]+", name.strip())
        if dist is None or dist.group(0) == "corral":
            continue
        try:
            importlib.metadata.distribution(dist.group(0))
        except importlib.metadata.PackageNotFoundError:
            return True
    return False


def _check(args: argparse.Namespace) -> int:
    env = build_env(args.id, parse_kwargs(args.kwargs))
    try:
        report = check_env(
            env,
            seed=args.seed,
            max_steps=args.steps,
            episodes=args.episodes,
            raise_on_error=False,
        )
    finally:
        env.close()
    report.env = args.id
    print(report)
    return 0 if report.ok else 1


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
