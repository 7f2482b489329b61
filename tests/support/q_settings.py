"""Settings of the Q-learners (DQN, VDN, QMIX) under which the matrix games' small tables
learn within a few thousand steps: a big step size, an early start, a short epsilon decay."""

from __future__ import annotations

FAST_TABLES = {
    "gamma": 1.0,
    "lr": 3e-3,
    "hidden": (32,),
    "learning_starts": 100,
    "train_freq": 4,
    "target_update_interval": 50,
    "epsilon_decay_steps": 2_000,
    "huber_delta": 10.0,
}
