"""Grouping agents with identical spaces: by prefix, per agent, or by an explicit map."""

from __future__ import annotations

import pytest
from gymnasium import spaces

from corral.errors import GroupError
from corral.groups import group_agents, prefix_of

AGENTS = ["adversary_0", "agent_0", "agent_1", "agent_2"]
OBS = {
    "adversary_0": spaces.Box(-1, 1, (8,)),
    "agent_0": spaces.Box(-1, 1, (10,)),
    "agent_1": spaces.Box(-1, 1, (10,)),
    "agent_2": spaces.Box(-1, 1, (10,)),
}
ACT = dict.fromkeys(AGENTS, spaces.Discrete(5))


def groups(group_map: object = None, agents: list[str] = AGENTS) -> dict[str, list[str]]:
    return group_agents(agents, OBS.__getitem__, ACT.__getitem__, group_map)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("agent", "prefix"),
    [("adversary_0", "adversary"), ("agent-12", "agent"), ("player3", "player"), ("7", "7")],
)
def test_prefix_of_strips_the_trailing_index(agent: str, prefix: str) -> None:
    assert prefix_of(agent) == prefix


def test_default_groups_by_prefix_in_agent_order() -> None:
    expected = {"adversary": ["adversary_0"], "agent": ["agent_0", "agent_1", "agent_2"]}
    assert groups() == expected
    assert groups("prefix") == expected
    assert list(groups(agents=["agent_1", "adversary_0", "agent_0"])) == ["agent", "adversary"]


def test_agent_gives_one_group_per_agent() -> None:
    assert groups("agent") == {agent: [agent] for agent in AGENTS}


def test_map_from_agent_to_group() -> None:
    group_map = {"adversary_0": "red", "agent_0": "blue", "agent_1": "blue", "agent_2": "green"}
    assert groups(group_map) == {
        "red": ["adversary_0"],
        "blue": ["agent_0", "agent_1"],
        "green": ["agent_2"],
    }


def test_map_from_group_to_agents() -> None:
    group_map = {"team": ["agent_2", "agent_0", "agent_1"], "solo": ["adversary_0"]}
    assert groups(group_map) == {"solo": ["adversary_0"], "team": ["agent_0", "agent_1", "agent_2"]}


def test_mixed_observation_spaces_name_both_agents() -> None:
    with pytest.raises(GroupError) as err:
        groups({"all": AGENTS})
    message = str(err.value)
    assert "'adversary_0'" in message
    assert "'agent_0'" in message
    assert "observation spaces" in message
    assert isinstance(err.value, ValueError)


def test_mixed_action_spaces_name_both_agents() -> None:
    act = {**ACT, "agent_2": spaces.Discrete(3)}
    with pytest.raises(GroupError, match=r"action spaces: 'agent_0' has .* 'agent_2' has"):
        group_agents(AGENTS, OBS.__getitem__, act.__getitem__)


def test_agent_missing_from_the_map_is_an_error() -> None:
    with pytest.raises(GroupError, match="agent 'agent_2' is in no group"):
        groups({"adversary_0": "red", "agent_0": "blue", "agent_1": "blue"})


def test_unknown_group_map_string_is_an_error() -> None:
    with pytest.raises(GroupError, match="'team'"):
        groups("team")


@pytest.mark.parametrize(
    ("group_map", "said"),
    [
        # an agent in two groups went to the first silently
        (
            {"red": ["adversary_0", "agent_0"], "blue": ["agent_0", "agent_1", "agent_2"]},
            "agent 'agent_0' is in two groups of the group map: 'red' and 'blue'",
        ),
        # a name that is no agent was ignored
        (
            {"red": ["adversary_0"], "blue": ["agent_0", "agent_1", "agent_2", "agent_3"]},
            "the group map names ['agent_3'], which are not agents of the env",
        ),
        ({"adversary_0": "red", "agnt_0": "blue"}, "names ['agnt_0'], which are not agents"),
        # a group given one agent's name was read as an agent -> group entry
        ({"red": "adversary_0", "blue": ["agent_0"]}, "a mapping group name -> list of agents"),
        # other types raised AttributeError or TypeError
        (1, "group_map must be 'prefix' (the default), 'agent', a mapping"),
        (True, "got True"),
        (["agent_0"], "got ['agent_0']"),
        ({"agent_0": 1}, "got {'agent_0': 1}"),
    ],
)
def test_a_group_map_that_cannot_be_read_says_why(group_map: object, said: str) -> None:
    with pytest.raises(GroupError) as caught:
        groups(group_map)
    assert said in str(caught.value)


def test_the_default_group_map_by_name_keeps_the_natively_batched_env() -> None:
    """``group_map="prefix"`` is the default grouping, which a natively batched env's own
    groups follow: it built the dict envs instead (30 times slower on simple_spread)."""
    pytest.importorskip("mpe2")
    import corral

    for group_map in (None, "prefix"):
        venv = corral.make_vec("mpe2/simple_spread_v3", 4, group_map=group_map)
        try:
            assert venv.native and venv.groups == {"agent": ("agent_0", "agent_1", "agent_2")}
        finally:
            venv.close()
