"""Record one greedy episode of a trained algorithm as a GIF."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from corral.algos.base import Algorithm
from corral.errors import CorralError, EnvError, MissingDependencyError
from corral.training.collector import Collector
from corral.training.config import TrainConfig
from corral.training.runner import build_venv, fixed_players, seating, uses_state

if TYPE_CHECKING:
    from corral.vector.protocols import VecEnv


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
    """The ``rgb_array`` frames of one greedy episode (the reset frame, then one per step).

    The frame after the last step is not among them: the env has already
    started its next episode then.
    """
    env = config.run.env
    try:
        venv = build_venv(
            config.run,
            num_envs=1,
            backend="sync",
            state=uses_state(config),
            native=False,  # frames come from a dict env's render()
            render_mode="rgb_array",
        )
    except (TypeError, ValueError, EnvError) as err:
        raise RenderError(f"{env} cannot render rgb_array frames: {err}") from err
    try:
        modes = venv.metadata.get("render_modes") or []
        if "rgb_array" not in modes:
            raise RenderError(f"{env} cannot render rgb_array frames (its render modes: {modes})")
        fixed, seats = fixed_players(config, venv), seating(config, venv)
        collector = Collector(venv, algo, fixed, seed=seed, seating=seats)
        frames = [_frame(venv, env)]
        for _ in range(max_steps - 1):
            collector.run(1, learn=False)  # one greedy step of the one env
            if collector.batch.done[0]:
                break
            frames.append(_frame(venv, env))
        return frames
    finally:
        venv.close()


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


def _frame(venv: VecEnv, env: str) -> np.ndarray:
    frame = venv.render()[0]
    array = np.asarray(frame) if frame is not None else None
    if array is None or array.ndim != 3 or array.shape[-1] not in (3, 4):
        what = "nothing" if array is None else f"an array of shape {array.shape}"
        raise RenderError(f"{env} rendered {what}, not an rgb_array frame [H, W, 3]")
    return array[..., :3].astype(np.uint8, copy=False)
