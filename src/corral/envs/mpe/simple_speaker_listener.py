"""``mpe2/simple_speaker_listener_v4`` natively batched: an immovable speaker who sees the
goal landmark's colour tells a silent listener where to go."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.arrays import to_numpy
from corral.batched_env import Array
from corral.envs.mpe.batched_mpe import BatchedMPE, Draws

AGENT_COLOUR = np.array([0.25, 0.25, 0.25])
LANDMARK_COLOURS = np.array([[0.65, 0.15, 0.15], [0.15, 0.65, 0.15], [0.15, 0.15, 0.65]])
# The listener wears its goal landmark's colour lightened by this.
LISTENER_TINT = np.array([0.45, 0.45, 0.45])
SPEAKER, LISTENER, FIRST_LANDMARK = 0, 1, 2


class BatchedSimpleSpeakerListener(BatchedMPE):
    """``num_envs`` copies of mpe2's ``simple_speaker_listener_v4`` (see
    :class:`BatchedMPE`), with all its arguments: ``max_cycles``, ``continuous_actions``
    and ``dynamic_rescaling``.

    :attr:`goal` ``[E]`` holds the landmark the listener must reach (the speaker's
    ``goal_b``). The speaker never moves, yet its position is drawn at reset, as in mpe2.
    """

    mpe2_module = "mpe2.simple_speaker_listener.simple_speaker_listener"

    def setup(self, raw: Any) -> None:
        self.goal = self.place.zeros((self.num_envs,), np.int64)
        self._rows = self.table(np.arange(self.num_envs), np.int64)
        self._colours = self.table(LANDMARK_COLOURS)
        self._landmarks = len(LANDMARK_COLOURS)

    def reset_world(self, draw: Draws, where: Array | None) -> None:
        self.goal = self.select(where, draw.integers(self._landmarks), self.goal)
        entities = 2 + self._landmarks
        self.place_entities(where, draw.uniform(-1, 1, 2 * entities).reshape(-1, entities, 2))

    def observe(self) -> dict[str, Array]:
        world, e = self.world, self.num_envs
        pos = world.pos
        to_landmarks = pos[:, FIRST_LANDMARK:] - pos[:, LISTENER : LISTENER + 1]
        listener = [
            world.vel[:, LISTENER : LISTENER + 1],
            to_landmarks.reshape(e, 1, -1),
            world.comm[:, SPEAKER : SPEAKER + 1],
        ]
        return {
            "speaker": self.assemble([self._colours[self.goal][:, None]]),
            "listener": self.assemble(listener),
        }

    def reward(self) -> Array:
        pos = self.world.pos
        delta = pos[:, LISTENER] - pos[self._rows, FIRST_LANDMARK + self.goal]
        shared = -(delta[:, 0] * delta[:, 0] + delta[:, 1] * delta[:, 1])
        return self.ops.stack([shared, shared], 1)

    def to_mpe2_extra(self, copy: int, env: Any) -> None:
        world = env.world
        speaker, listener = world.agents
        speaker.goal_a = listener
        speaker.goal_b = world.landmarks[int(to_numpy(self.goal[copy]))]
        listener.goal_a = listener.goal_b = None
        for agent in world.agents:
            agent.color = AGENT_COLOUR.copy()
        for landmark, colour in zip(world.landmarks, LANDMARK_COLOURS, strict=True):
            landmark.color = colour.copy()
        listener.color = speaker.goal_b.color + LISTENER_TINT

    def from_mpe2_extra(self, env: Any, copy: int) -> None:
        world = env.world
        self.goal[copy] = world.landmarks.index(world.agents[SPEAKER].goal_b)
