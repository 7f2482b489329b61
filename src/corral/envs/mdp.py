"""Small MDPs and matrix games with known optimal values: ``mdp/...``.

Learning algorithms are verified against these: each env has an
``optimal_return`` attribute, the optimal expected episode return of each
agent (a dict keyed by agent id). Two generic classes hold the dynamics as
tables, and each registered id is one function that fills them in:

* :class:`TabularMDP`: a single agent ``agent_0`` on a finite acyclic MDP
  with one-hot observations (``mdp/one_round_dmdp``, ``mdp/two_round_dmdp``,
  ``mdp/one_round_nmdp``, ``mdp/two_round_nmdp``, ``mdp/multi_round_nmdp``;
  ``d``: deterministic, ``n``: stochastic transitions).
* :class:`MatrixGame`: players act once, simultaneously, and are paid from a
  payoff table (``mdp/climbing``, ``mdp/penalty``, ``mdp/matching_pennies``).

Every id (registered by :mod:`corral.envs.mdp_ids`) is also natively batched
(:mod:`corral.envs.mdp_batched`, built from the same tables):
``corral.spec(id).make_batched(num_envs)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.env import AgentID, InfoDict, MultiAgentEnv, ObsDict, StepResult, validate_actions

Outcome = tuple[float, int, float]
"""One possible result of an action: (probability, next state, reward)."""


class TabularMDP(MultiAgentEnv):
    """A finite acyclic MDP for one agent, ``agent_0``, given by its tables.

    ``transitions[s, a, s2]`` is the probability of moving from ``s`` to
    ``s2`` under action ``a`` and ``rewards[s, a, s2]`` the reward for it
    (a ``[s, a]`` table means the reward does not depend on ``s2``). The
    episode starts in ``initial_state`` (a state or a distribution over
    states) and terminates on entering one of ``terminal_states``; the
    transitions must not contain a cycle, so every episode ends within
    ``num_states`` steps. Observations and the global state are one-hots of
    the state (``float32[num_states]``); actions are ``Discrete(num_actions)``.

    ``optimal_return["agent_0"]`` is the optimal expected return from the
    initial distribution, by backward induction over the tables.

    Examples:
        >>> env = TabularMDP.from_outcomes(
        ...     {(0, 0): [(1.0, 1, 0.0)], (0, 1): [(1.0, 1, 4.0)]},
        ...     num_states=2, num_actions=2, terminal_states=[1])
        >>> env.optimal_return
        {'agent_0': 4.0}
    """

    metadata = {"render_modes": ["ansi"], "name": "tabular_mdp"}
    simultaneous = True  # one agent, acting at every step

    def __init__(
        self,
        transitions: Any,
        rewards: Any,
        terminal_states: Sequence[int],
        initial_state: int | Sequence[float] = 0,
        render_mode: str | None = None,
    ) -> None:
        self.transitions = np.array(transitions, dtype=np.float64)
        shape = self.transitions.shape
        if len(shape) != 3 or shape[0] != shape[2]:
            raise ValueError(f"transitions must have shape (S, A, S), got {shape}")
        num_states, num_actions, _ = shape
        self.rewards = np.broadcast_to(
            np.array(rewards, dtype=np.float64).reshape(num_states, num_actions, -1),
            self.transitions.shape,
        ).copy()
        self.terminal = np.zeros(num_states, dtype=bool)
        self.terminal[list(terminal_states)] = True
        initial = np.array(initial_state, dtype=np.float64)
        self.initial = np.eye(num_states)[int(initial)] if initial.ndim == 0 else initial
        _check_tables(self.transitions, self.terminal, self.initial)
        self.check_render_mode(render_mode)
        self.render_mode = render_mode
        self.possible_agents = ["agent_0"]
        self.agents = []
        self._obs_space = spaces.Box(0.0, 1.0, shape=(num_states,), dtype=np.float32)
        self.state_space = self._obs_space
        self._action_space = spaces.Discrete(num_actions)
        self._one_hots = np.eye(num_states, dtype=np.float32)
        # Ending each cumulative row at exactly 1 keeps rounding from picking an impossible state.
        self._cumulative = np.cumsum(self.transitions, axis=-1)
        self._cumulative[..., -1] = 1.0
        self._initial_cumulative = np.cumsum(self.initial)
        self._initial_cumulative[-1] = 1.0
        values = _optimal_values(self.transitions, self.rewards, self.terminal)
        self.optimal_return = {"agent_0": float(self.initial @ values)}
        self._rng: np.random.Generator | None = None  # drawn at the first reset
        self._state = 0
        self._step = 0

    @classmethod
    def from_outcomes(
        cls,
        outcomes: Mapping[tuple[int, int], Sequence[Outcome]],
        num_states: int,
        num_actions: int,
        terminal_states: Sequence[int],
        **kwargs: Any,
    ) -> TabularMDP:
        """Build the tables from ``{(state, action): [(probability, next_state, reward)]}``."""
        transitions = np.zeros((num_states, num_actions, num_states))
        rewards = np.zeros((num_states, num_actions, num_states))
        for (state, action), results in outcomes.items():
            for probability, next_state, reward in results:
                if transitions[state, action, next_state] and (
                    rewards[state, action, next_state] != reward
                ):
                    raise ValueError(
                        f"outcomes of {(state, action)} lead to state {next_state} with two "
                        "rewards; give the outcomes distinct next states"
                    )
                transitions[state, action, next_state] += probability
                rewards[state, action, next_state] = reward
        return cls(transitions, rewards, terminal_states, **kwargs)

    @property
    def sampling_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """The cumulative tables the env samples by, each row ending at exactly 1: the initial
        distribution ``[S]`` and the transitions ``[S, A, S]`` (read-only views)."""
        initial, transitions = self._initial_cumulative.view(), self._cumulative.view()
        initial.flags.writeable = transitions.flags.writeable = False
        return initial, transitions

    @property
    def max_episode_steps(self) -> int:  # type: ignore[override]
        """An acyclic path visits each state at most once: at most ``num_states - 1`` steps."""
        return len(self.terminal) - 1

    def observation_space(self, agent: AgentID) -> spaces.Box:
        """A one-hot of the state."""
        return self._obs_space

    def action_space(self, agent: AgentID) -> spaces.Discrete:
        """``Discrete(num_actions)``."""
        return self._action_space

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        """Draw the initial state from the seeded generator."""
        if seed is not None or self._rng is None:
            self._rng = np.random.default_rng(seed)
        self._state = self._sample(self._initial_cumulative)
        self._step = 0
        self.agents = ["agent_0"]
        return {"agent_0": self._one_hots[self._state].copy()}, {"agent_0": {}}

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        """Draw the next state; terminate on entering a terminal state."""
        if self.check_actions:
            validate_actions(actions, self.agents, self.action_space, {}, self._step)
        self._step += 1
        state, action = self._state, int(actions["agent_0"])
        self._state = self._sample(self._cumulative[state, action])
        rewards = {"agent_0": float(self.rewards[state, action, self._state])}
        obs = self._one_hots[self._state].copy()
        done = bool(self.terminal[self._state])
        if done:
            self.agents = []
            return (
                {},
                rewards,
                {"agent_0": True},
                {"agent_0": False},
                {"agent_0": {"final_obs": obs}},
            )
        return {"agent_0": obs}, rewards, {"agent_0": False}, {"agent_0": False}, {"agent_0": {}}

    def state(self) -> np.ndarray:
        """A one-hot of the state."""
        return self._one_hots[self._state].copy()

    def render(self) -> str | None:
        """The current state and step, as text."""
        if self.render_mode != "ansi":
            return None
        return f"step {self._step}: state {self._state}\n"

    def _sample(self, cumulative: np.ndarray) -> int:
        assert self._rng is not None, "reset() draws the generator"
        return int(np.searchsorted(cumulative, self._rng.random(), side="right"))


class MatrixGame(MultiAgentEnv):
    """A one-shot normal-form game: every player acts once, simultaneously.

    ``payoffs[i][a_0, ..., a_{n-1}]`` is what ``player_i`` earns for the
    joint action; ``player_i`` has ``Discrete(payoffs.shape[i + 1])``
    actions. Observations and the global state are a constant ``float32[1]``.
    After the single step every player terminates.

    ``optimal_return``: in a common-payoff game (all players paid the same
    table) the best joint payoff, for every player; otherwise ``value`` (the
    per-player value of the game, e.g. its minimax value) if given, else
    ``None``.
    """

    metadata = {"render_modes": ["ansi"], "name": "matrix_game"}
    simultaneous = True

    def __init__(
        self,
        payoffs: Any,
        value: Sequence[float] | None = None,
        render_mode: str | None = None,
    ) -> None:
        self.payoffs = np.array(payoffs, dtype=np.float64)
        num_players = self.payoffs.shape[0]
        if self.payoffs.ndim != num_players + 1:
            raise ValueError(
                f"payoffs of {num_players} players need shape (players, actions_0, ...), "
                f"got {self.payoffs.shape}"
            )
        self.check_render_mode(render_mode)
        self.render_mode = render_mode
        self.possible_agents = [f"player_{i}" for i in range(num_players)]
        self.agents = []
        self._action_spaces = {
            a: spaces.Discrete(n)
            for a, n in zip(self.possible_agents, self.payoffs.shape[1:], strict=True)
        }
        self._obs_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
        self.state_space = self._obs_space
        self.optimal_return = _matrix_optimum(self.payoffs, self.possible_agents, value)
        self._last: tuple[int, ...] | None = None
        self._step = 0

    max_episode_steps = 1  # one simultaneous move

    def observation_space(self, agent: AgentID) -> spaces.Box:
        """A constant ``float32[1]``: the game has a single state."""
        return self._obs_space

    def action_space(self, agent: AgentID) -> spaces.Discrete:
        """One action per row (``player_0``), column (``player_1``), ... of the table."""
        return self._action_spaces[agent]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        """Every player is asked to act. The game has no chance events."""
        self.agents = list(self.possible_agents)
        self._last = None
        self._step = 0
        return {a: self.state() for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        """Pay every player from the table; the game is over."""
        if self.check_actions:
            validate_actions(actions, self.agents, self.action_space, {}, self._step)
        self._step += 1
        joint = tuple(int(actions[a]) for a in self.possible_agents)
        rewards = {a: float(self.payoffs[(i, *joint)]) for i, a in enumerate(self.possible_agents)}
        done = dict.fromkeys(self.possible_agents, True)
        infos = {a: {"final_obs": self.state()} for a in self.possible_agents}
        self.agents = []
        self._last = joint
        return {}, rewards, done, dict.fromkeys(self.possible_agents, False), infos

    def state(self) -> np.ndarray:
        """A constant ``float32[1]``."""
        return np.zeros(1, dtype=np.float32)

    def render(self) -> str | None:
        """The joint action played and its payoffs, as text."""
        if self.render_mode != "ansi":
            return None
        if self._last is None:
            return "waiting for actions\n"
        every_player: tuple[slice | int, ...] = (slice(None), *self._last)
        paid = self.payoffs[every_player].tolist()
        return f"joint action {list(self._last)}: payoffs {paid}\n"


def one_round_dmdp(render_mode: str | None = None) -> TabularMDP:
    """One deterministic decision: action 0 earns -1, action 1 earns +1.

    Optimal return 1 (take action 1).
    """
    outcomes = {(0, 0): [(1.0, 1, -1.0)], (0, 1): [(1.0, 1, 1.0)]}
    return TabularMDP.from_outcomes(outcomes, 2, 2, [1], render_mode=render_mode)


def two_round_dmdp(render_mode: str | None = None) -> TabularMDP:
    """Two deterministic decisions; the greedy first move is a trap.

    From state 0, action 0 earns 0 and leads to state 1, action 1 earns 1 and
    leads to state 2. In state 1 action 0 earns 3 (action 1: 0); in state 2
    action 1 earns 1 (action 0: 0). Both end the episode.

    Optimal return 3 (action 0, then action 0); the greedy path earns 2.
    """
    outcomes = {
        (0, 0): [(1.0, 1, 0.0)],
        (0, 1): [(1.0, 2, 1.0)],
        (1, 0): [(1.0, 3, 3.0)],
        (1, 1): [(1.0, 3, 0.0)],
        (2, 0): [(1.0, 3, 0.0)],
        (2, 1): [(1.0, 3, 1.0)],
    }
    return TabularMDP.from_outcomes(outcomes, 4, 2, [3], render_mode=render_mode)


def one_round_nmdp(render_mode: str | None = None) -> TabularMDP:
    """One decision with a chance outcome: safe or risky.

    Action 0 earns 0.5 for sure. Action 1 earns 2 with probability 0.5 and
    -0.5 otherwise (expected 0.75).

    Optimal return 0.75 (take the risky action 1).
    """
    outcomes = {(0, 0): [(1.0, 1, 0.5)], (0, 1): [(0.5, 2, 2.0), (0.5, 1, -0.5)]}
    return TabularMDP.from_outcomes(outcomes, 3, 2, [1, 2], render_mode=render_mode)


def two_round_nmdp(render_mode: str | None = None) -> TabularMDP:
    """Two decisions; the first picks the odds of reaching a good state.

    From state 0, action 0 earns 0 and reaches the good state 1 with
    probability 0.8 (else the bad state 2); action 1 earns 0.3 and reaches
    state 1 with probability 0.2. In state 1 action 1 earns 2 (action 0: 0);
    in state 2 action 0 earns 1 (action 1: 0). Both end the episode.

    Optimal return 1.8 (action 0; then action 1 in state 1, action 0 in
    state 2); starting with action 1 yields 1.5.
    """
    outcomes = {
        (0, 0): [(0.8, 1, 0.0), (0.2, 2, 0.0)],
        (0, 1): [(0.2, 1, 0.3), (0.8, 2, 0.3)],
        (1, 0): [(1.0, 3, 0.0)],
        (1, 1): [(1.0, 3, 2.0)],
        (2, 0): [(1.0, 3, 1.0)],
        (2, 1): [(1.0, 3, 0.0)],
    }
    return TabularMDP.from_outcomes(outcomes, 4, 2, [3], render_mode=render_mode)


GAMBLE_ODDS = (0.9, 0.8, 0.6, 0.4)


def multi_round_nmdp(render_mode: str | None = None) -> TabularMDP:
    """Push your luck for up to five rounds; the only reward comes at the end.

    State ``k`` (0 to 4) holds a pot of ``2**k``. Action 0 banks it: the
    episode ends with reward ``2**k``. Action 1 gambles: with probability
    0.9, 0.8, 0.6, 0.4 (in states 0 to 3) the pot doubles (state ``k + 1``,
    reward 0), otherwise it is lost (the episode ends, reward 0). In state 4
    both actions bank. State 5 is terminal.

    Optimal return 3.456 = 0.9 * 0.8 * 0.6 * 8 (gamble in states 0, 1 and 2,
    bank in state 3).
    """
    top = len(GAMBLE_ODDS)
    end = top + 1
    outcomes: dict[tuple[int, int], list[Outcome]] = {}
    for k, odds in enumerate(GAMBLE_ODDS):
        outcomes[k, 0] = [(1.0, end, 2.0**k)]
        outcomes[k, 1] = [(odds, k + 1, 0.0), (1.0 - odds, end, 0.0)]
    outcomes[top, 0] = outcomes[top, 1] = [(1.0, end, 2.0**top)]
    return TabularMDP.from_outcomes(outcomes, top + 2, 2, [end], render_mode=render_mode)


def climbing_game(render_mode: str | None = None) -> MatrixGame:
    """The climbing game (Claus & Boutilier 1998), common payoff::

        11  -30   0
        -30   7   6
         0    0   5

    Optimal joint return 11 (both play action 0); independent learners tend
    to settle on (1, 1) or (2, 2) instead.
    """
    table = [[11, -30, 0], [-30, 7, 6], [0, 0, 5]]
    return MatrixGame([table, table], render_mode=render_mode)


def penalty_game(k: float = -100.0, render_mode: str | None = None) -> MatrixGame:
    """The penalty game (Claus & Boutilier 1998) with penalty ``k <= 0``, common payoff::

        10  0  k
         0  2  0
         k  0 10

    Optimal joint return 10 (both play 0, or both play 2); miscoordinating
    between the two optima costs ``k``.
    """
    if k > 0:
        raise ValueError(f"the penalty k must be <= 0, got {k}")
    table = [[10, 0, k], [0, 2, 0], [k, 0, 10]]
    return MatrixGame([table, table], render_mode=render_mode)


def matching_pennies(render_mode: str | None = None) -> MatrixGame:
    """Matching pennies, zero-sum: ``player_0`` wins 1 if the actions match, else loses 1.

    Minimax value 0 for both players (each plays uniformly at random).
    """
    table = np.array([[1.0, -1.0], [-1.0, 1.0]])
    return MatrixGame([table, -table], value=[0.0, 0.0], render_mode=render_mode)


def _check_tables(transitions: np.ndarray, terminal: np.ndarray, initial: np.ndarray) -> None:
    num_states = len(terminal)
    sums = transitions[~terminal].sum(axis=-1)
    if (transitions < 0).any() or not np.allclose(sums, 1.0):
        raise ValueError("each non-terminal transitions[s, a] must be a probability distribution")
    if initial.shape != (num_states,) or not np.isclose(initial.sum(), 1.0):
        raise ValueError(f"initial_state must be a state or a distribution over {num_states}")
    if initial[terminal].any():
        raise ValueError("an episode cannot start in a terminal state")
    edges = (transitions > 0).any(axis=1) & ~terminal[:, None]
    reach = edges.copy()
    for _ in range(num_states):
        reach = (reach.astype(np.int64) @ edges.astype(np.int64)) > 0
    if reach.any():
        raise ValueError("the transitions contain a cycle; every episode must end in a terminal")


def _optimal_values(
    transitions: np.ndarray, rewards: np.ndarray, terminal: np.ndarray
) -> np.ndarray:
    """Optimal state values by backward induction (exact in ``S`` sweeps of an acyclic MDP)."""
    values = np.zeros(len(terminal))
    for _ in range(len(terminal)):
        q = (transitions * (rewards + values)).sum(axis=-1)
        values = np.where(terminal, 0.0, q.max(axis=1))
    return values


def _matrix_optimum(
    payoffs: np.ndarray, agents: list[AgentID], value: Sequence[float] | None
) -> dict[AgentID, float] | None:
    if value is not None:
        return {a: float(v) for a, v in zip(agents, value, strict=True)}
    if (payoffs == payoffs[0]).all():
        return dict.fromkeys(agents, float(payoffs[0].max()))
    return None
