"""Partition agents into groups of identical spaces, for the vector layer."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gymnasium import spaces

from corral.errors import GroupError

GroupMap = str | Mapping[str, str] | Mapping[str, Iterable[str]] | None

_INDEX_SUFFIX = re.compile(r"[_\-]?\d+$")


def prefix_of(agent: str) -> str:
    """The agent's name without its trailing index: ``adversary_0`` -> ``adversary``."""
    return _INDEX_SUFFIX.sub("", agent) or agent


def group_agents(
    agents: Iterable[str],
    observation_space: Callable[[str], spaces.Space],
    action_space: Callable[[str], spaces.Space],
    group_map: GroupMap = None,
) -> dict[str, list[str]]:
    """Groups of agents with identical spaces, in the order agents are given.

    ``group_map`` is ``None`` or ``"prefix"`` (group by name prefix),
    ``"agent"`` (one group per agent), a mapping agent -> group, or a mapping
    group -> agents. A group whose agents' spaces differ raises
    :class:`GroupError` naming the two agents and their spaces.

    Examples:
        >>> from gymnasium.spaces import Discrete
        >>> group_agents(["adversary_0", "agent_0", "agent_1"], lambda a: Discrete(2),
        ...              lambda a: Discrete(3))
        {'adversary': ['adversary_0'], 'agent': ['agent_0', 'agent_1']}
    """
    agents = list(agents)
    group_map = checked_group_map(group_map)
    if isinstance(group_map, Mapping):  # agent -> group, or group -> agents (checked)
        by_agent = all(isinstance(v, str) for v in group_map.values())
        named = list(group_map) if by_agent else [a for v in group_map.values() for a in v]
        strangers = [a for a in named if a not in agents]
        if strangers:
            raise GroupError(
                f"the group map names {strangers}, which are not agents of the env: {agents}"
            )
    groups: dict[str, list[str]] = {}
    for agent in agents:
        groups.setdefault(_group_of(agent, group_map), []).append(agent)
    for name, members in groups.items():
        _check_same_spaces(name, members, observation_space, action_space)
    return groups


def checked_group_map(group_map: Any) -> GroupMap:
    """``group_map`` as :func:`group_agents` reads it, ``None`` for the default grouping
    (``"prefix"``, which a natively batched env's own groups follow); a :class:`GroupError`
    saying what a group map is where it is none, or where a mapping gives an agent two groups.

    Examples:
        >>> checked_group_map("prefix") is None, checked_group_map({"a_0": "x"})
        (True, {'a_0': 'x'})
    """
    if group_map is None or group_map == "prefix":
        return None
    if group_map == "agent":
        return group_map
    if isinstance(group_map, Mapping) and group_map:
        lists = [not isinstance(v, str) for v in group_map.values()]
        if all(isinstance(k, str) for k in group_map) and len(set(lists)) == 1:
            if not lists[0]:
                return dict(group_map)
            if all(_names(v) for v in group_map.values()):
                _check_each_once(group_map)
                return {g: list(v) for g, v in group_map.items()}
    raise GroupError(
        f"group_map must be 'prefix' (the default), 'agent', a mapping agent -> group name or "
        f"a mapping group name -> list of agents; got {group_map!r}"
    )


def _names(value: Any) -> bool:
    return isinstance(value, Iterable) and all(isinstance(a, str) for a in value)


def _check_each_once(groups: Mapping[str, Iterable[str]]) -> None:
    seen: dict[str, str] = {}
    for group, members in groups.items():
        for agent in members:
            if agent in seen:
                raise GroupError(
                    f"agent {agent!r} is in two groups of the group map: {seen[agent]!r} and "
                    f"{group!r}"
                )
            seen[agent] = group


def _group_of(agent: str, group_map: GroupMap) -> str:
    """The group of ``agent`` by a :func:`checked_group_map`."""
    if group_map is None:
        return prefix_of(agent)
    if group_map == "agent":
        return agent
    assert isinstance(group_map, Mapping)  # checked_group_map's
    own = group_map.get(agent)
    if isinstance(own, str):
        return own
    for group, members in group_map.items():
        if not isinstance(members, str) and agent in members:
            return group
    raise GroupError(f"agent {agent!r} is in no group of the group map {dict(group_map)}")


def _check_same_spaces(
    group: str,
    members: list[str],
    observation_space: Callable[[str], spaces.Space],
    action_space: Callable[[str], spaces.Space],
) -> None:
    first = members[0]
    for other in members[1:]:
        for kind, space_of in (("observation", observation_space), ("action", action_space)):
            a: Any = space_of(first)
            b: Any = space_of(other)
            if a != b:
                raise GroupError(
                    f"group {group!r} mixes {kind} spaces: {first!r} has {a}, {other!r} has {b}; "
                    "pass a group map that separates them (e.g. group_map='agent')"
                )
