"""OpenSpiel games under the corral contract.

Any ``pyspiel`` game is an env: ``corral.make("openspiel/leduc_poker")``,
``corral.make("openspiel/goofspiel", num_cards=4)`` (keyword arguments are the
game's parameters) or ``corral.adapt(pyspiel.load_game("kuhn_poker"))``.
Players are ``player_0 .. player_{n-1}``. At a sequential node only the player
to move is in ``obs``; at a simultaneous node every player is. Chance nodes
are sampled by the env (seeded in ``reset``) and never reach the user.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium import spaces

from corral.adapters import register_adapter
from corral.env import AgentID, InfoDict, MultiAgentEnv, ObsDict, StepResult, validate_actions

if TYPE_CHECKING:
    import pyspiel


class OpenSpielEnv(MultiAgentEnv):
    """An OpenSpiel game as a corral env.

    Args:
        game: a game name (``"kuhn_poker"``) or a loaded ``pyspiel.Game``.
        render_mode: ``"ansi"`` to make :meth:`render` return the state as text.
        **params: the game's parameters, passed to ``pyspiel.load_game``
            (only with a game name).

    Observations are the game's information-state tensor when it has one,
    else its observation tensor, as ``float32`` arrays of the tensor's shape.
    ``rewards[a]`` is the change of ``a``'s return during the step, so an
    agent's rewards sum to ``state.returns()`` at the end of the episode.
    ``metadata`` says from the game's type whether it is ``zero_sum`` and, for
    sequential games of several players, that it is not ``lockstep``.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self, game: str | pyspiel.Game, render_mode: str | None = None, **params: Any
    ) -> None:
        import pyspiel

        if isinstance(game, str):
            if params and "(" in game:  # pyspiel would not find such a name, and list every game
                raise ValueError(
                    f"{game!r} holds its parameters already: give them there or as keyword "
                    f"arguments ({sorted(params)}), not both"
                )
            game = pyspiel.load_game(game, params) if params else pyspiel.load_game(game)
        elif params:
            raise TypeError("game parameters can only be given with a game name, not a Game")
        game_type = game.get_type()
        if game_type.dynamics == pyspiel.GameType.Dynamics.MEAN_FIELD:
            raise ValueError(
                f"{game_type.short_name!r} is a mean-field game, which is not supported"
            )
        if game_type.provides_information_state_tensor:
            self._tensor_name = "information_state_tensor"
            shape = game.information_state_tensor_shape()
        elif game_type.provides_observation_tensor:
            self._tensor_name = "observation_tensor"
            shape = game.observation_tensor_shape()
        else:
            raise ValueError(
                f"{game_type.short_name!r} provides neither an information-state nor an "
                "observation tensor, so it has no array observation"
            )
        self.check_render_mode(render_mode)
        self.game = game
        self.render_mode = render_mode
        # Every player acts at every node of a simultaneous-move game (chance is sampled here).
        self.simultaneous = game_type.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS
        # A game that samples its chance itself draws from its own generator, seeded by its
        # rng_seed parameter: reset(seed) loads it again with a seed drawn from ``seed``.
        self._seeds_game = (
            game_type.chance_mode == pyspiel.GameType.ChanceMode.SAMPLED_STOCHASTIC
            and "rng_seed" in game_type.parameter_specification
        )
        self.metadata = {
            **self.metadata,
            "name": game_type.short_name,
            "zero_sum": game_type.utility == pyspiel.GameType.Utility.ZERO_SUM,
        }
        if game_type.dynamics == pyspiel.GameType.Dynamics.SEQUENTIAL and game.num_players() > 1:
            self.metadata["lockstep"] = False
        self.possible_agents = [f"player_{i}" for i in range(game.num_players())]
        self.agents = []
        self._shape = tuple(shape)
        self._obs_space = spaces.Box(-np.inf, np.inf, self._shape, np.float32)
        self._act_space = spaces.Discrete(game.num_distinct_actions())
        self._state: pyspiel.State | None = None
        self._rng = np.random.default_rng()
        self._paid = np.zeros(len(self.possible_agents))
        self._acting: list[AgentID] = []
        self._masks: dict[AgentID, np.ndarray] = {}
        self._step = 0

    @property
    def spiel_state(self) -> pyspiel.State | None:
        """The underlying ``pyspiel.State`` of the current episode (read it, don't change it)."""
        return self._state

    @property
    def max_episode_steps(self) -> int:  # type: ignore[override]
        """The game's ``max_game_length()``: a bound on its decisions, so on its steps."""
        return int(self.game.max_game_length())

    def observation_space(self, agent: AgentID) -> spaces.Box:
        return self._obs_space

    def action_space(self, agent: AgentID) -> spaces.Discrete:
        return self._act_space

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
            if self._seeds_game:
                self._reload_game(int(self._rng.integers(2**31 - 1)))
        self._state = self.game.new_initial_state()
        self._paid = np.zeros(len(self.possible_agents))
        self._step = 0
        self._sample_chance()
        self.agents = [] if self._state.is_terminal() else list(self.possible_agents)
        return self._observe()

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        if self.check_actions:
            validate_actions(actions, self._acting, self.action_space, self._masks, self._step)
        state = self._state
        assert state is not None  # validate_actions raised if reset() was never called
        if state.is_simultaneous_node():
            state.apply_actions([int(actions[agent]) for agent in self.possible_agents])
        else:
            state.apply_action(int(actions[self._acting[0]]))
        self._step += 1
        self._sample_chance()

        alive = self.agents
        # Paying what is still owed (rather than the change of the returns) keeps the
        # running sum of rewards equal to the returns, without floating-point drift.
        earned = np.asarray(state.returns(), dtype=np.float64) - self._paid
        self._paid = self._paid + earned
        rewards = {a: float(earned[self._index(a)]) for a in alive}
        done = state.is_terminal()
        terminations = dict.fromkeys(alive, done)
        truncations = dict.fromkeys(alive, False)
        obs, infos = self._observe()
        if done:
            for agent in alive:
                infos[agent] = {"final_obs": self._tensor(agent)}
            self.agents = []
        return obs, rewards, terminations, truncations, infos

    def render(self) -> str | None:
        if self.render_mode == "ansi" and self._state is not None:
            return str(self._state)
        return None

    def _reload_game(self, rng_seed: int) -> None:
        """The same game loaded again, its own chance generator seeded by ``rng_seed``."""
        import pyspiel

        params = {**self.game.get_parameters(), "rng_seed": rng_seed}
        self.game = pyspiel.load_game(self.game.get_type().short_name, params)

    def _sample_chance(self) -> None:
        """Play chance nodes with outcomes drawn from their probabilities."""
        state = self._state
        assert state is not None
        while state.is_chance_node():
            outcomes, probs = zip(*state.chance_outcomes(), strict=True)
            cumulative = np.cumsum(probs)
            pick = np.searchsorted(cumulative, self._rng.random() * cumulative[-1], side="right")
            state.apply_action(outcomes[min(int(pick), len(outcomes) - 1)])

    def _observe(self) -> tuple[ObsDict, InfoDict]:
        """Observations and action masks of the players who must act now."""
        state = self._state
        assert state is not None
        if state.is_terminal():
            players: list[int] = []
        elif state.is_simultaneous_node():
            players = list(range(len(self.possible_agents)))
        else:
            players = [state.current_player()]
        self._acting = [self.possible_agents[p] for p in players]
        self._masks = {}
        for player, agent in zip(players, self._acting, strict=True):
            mask = np.zeros(self._act_space.n, dtype=np.int8)
            mask[state.legal_actions(player)] = 1
            self._masks[agent] = mask
        obs = {agent: self._tensor(agent) for agent in self._acting}
        infos: InfoDict = {agent: {"action_mask": self._masks[agent]} for agent in self._acting}
        return obs, infos

    def _tensor(self, agent: AgentID) -> np.ndarray:
        values = getattr(self._state, self._tensor_name)(self._index(agent))
        return np.asarray(values, dtype=np.float32).reshape(self._shape)

    def _index(self, agent: AgentID) -> int:
        return self.possible_agents.index(agent)


def _is_pyspiel_game(env: Any) -> bool:
    pyspiel = sys.modules.get("pyspiel")
    return pyspiel is not None and isinstance(env, pyspiel.Game)


register_adapter(_is_pyspiel_game, OpenSpielEnv)
