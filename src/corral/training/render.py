"""Record one greedy episode of a trained algorithm as a GIF."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from corral.algos.base import Algorithm
from corral.errors import CorralError, EnvError, MissingDependencyError
from corral.registry import make
from corral.training.collector import Collector
from corral.training.config import TrainConfig
from corral.training.runner import env_spec, fixed_players, seating, uses_state
from corral.vector.vector_env import VectorEnv


class RenderError(CorralError, RuntimeError):
    """An env that cannot render ``rgb_array`` frames."""


def record_episode(
    config: TrainConfig,
    algo: Algorithm | Mapping[str, Algorithm],
    path: str | Path,
    *,
    seed: int = 0,
    max_steps: int = 500,
    fps: float = 10.0,
) -> int:
    """Play one greedy episode from ``reset(seed)`` and write its frames to the GIF ``path``.

    Returns the number of frames. Raises :class:`RenderError` for envs that
    cannot render ``rgb_array`` frames.
    """
    frames = episode_frames(config, algo, seed=seed, max_steps=max_steps)
    write_gif(path, frames, fps)
    return len(frames)


def episode_frames(
    config: TrainConfig,
    algo: Algorithm | Mapping[str, Algorithm],
    *,
    seed: int = 0,
    max_steps: int = 500,
) -> list[np.ndarray]:
    """The ``rgb_array`` frames of one greedy episode: the reset frame, then one per step,
    the last one as the episode ended."""
    run, env = config.run, config.run.env
    ended: list[np.ndarray] = []  # the frame before each autoreset: how an episode ended
    try:
        env_spec(run)  # imports the modules that register the env
        venv = VectorEnv(
            [lambda: _filming_its_end(make(env, render_mode="rgb_array", **run.env_kwargs), ended)],
            seed=run.seed,
            group_map=run.group_map,
            state=uses_state(config),
            on_env_error=run.on_env_error,
            check_finite=run.check_finite,
        )
    except (TypeError, ValueError, EnvError) as err:
        first = str(err).splitlines()[0]  # not the env's traceback
        raise RenderError(f"{env} cannot render rgb_array frames: {first}") from err
    try:
        modes = venv.metadata.get("render_modes") or []
        if "rgb_array" not in modes:
            raise RenderError(f"{env} cannot render rgb_array frames (its render modes: {modes})")
        fixed, seats = fixed_players(config, venv), seating(config, venv)
        collector = Collector(venv, algo, fixed, seed=seed, seating=seats)
        frames = [_frame(venv.render()[0], env)]
        for _ in range(max_steps - 1):
            collector.run(1, learn=False)  # one greedy step of the one env
            if collector.batch.done[0]:
                frames.append(ended[-1])
                break
            frames.append(_frame(venv.render()[0], env))
        return frames
    finally:
        venv.close()


def _filming_its_end(env: Any, ended: list[np.ndarray]) -> Any:
    """``env``, whose ``reset`` first adds the frame the env shows to ``ended``, after its
    first reset (the vector layer resets an env in the step its episode ends)."""
    reset, started = env.reset, [False]

    def reset_after_the_last_frame(*args: Any, **kwargs: Any) -> Any:
        if started[0]:
            ended.append(_frame(env.render(), env))
        started[0] = True
        return reset(*args, **kwargs)

    env.reset = reset_after_the_last_frame
    return env


def write_gif(path: str | Path, frames: Sequence[np.ndarray], fps: float = 10.0) -> None:
    """Write ``frames`` (``[H, W, 3]`` uint8) as a looping GIF, with imageio or else Pillow."""
    duration = 1000.0 / fps  # milliseconds per frame
    try:
        import imageio.v3 as iio
    except ModuleNotFoundError:
        pass
    else:
        iio.imwrite(path, np.stack(frames), extension=".gif", duration=duration, loop=0)
        return
    try:
        from PIL import Image
    except ModuleNotFoundError as err:
        raise MissingDependencyError(
            "writing a GIF needs imageio or Pillow: pip install 'corral[train]'"
        ) from err
    first, *rest = (Image.fromarray(f) for f in frames)
    first.save(path, save_all=True, append_images=rest, duration=duration, loop=0)


def _frame(frame: Any, env: Any) -> np.ndarray:
    """``frame`` (what ``env``'s ``render()`` returned) as ``[H, W, 3]`` uint8."""
    array = np.asarray(frame) if frame is not None else None
    if array is None or array.ndim != 3 or array.shape[-1] not in (3, 4):
        what = "nothing" if array is None else f"an array of shape {array.shape}"
        raise RenderError(f"{env} rendered {what}, not an rgb_array frame [H, W, 3]")
    return array[..., :3].astype(np.uint8, copy=False)
