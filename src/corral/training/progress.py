"""Progress of a run: a tqdm bar when tqdm is installed, else one log line per metrics row."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger("corral.training")

EVAL = "eval_return"


class LineProgress:
    """Logs env steps, steps/s, the training return and the ``metric`` column at every row.

    A resumed run's progress (``initial`` env steps done) starts with a line saying where
    it stands, as a bar starts drawn at ``initial``.
    """

    def __init__(self, total: int, initial: int = 0, metric: str = EVAL) -> None:
        self.total = total
        self.metric = metric
        if initial > 0:
            log.info("%s", describe({"env_steps": min(initial, total)}, total, metric))

    def update(self, row: Mapping[str, float]) -> None:
        log.info("%s", describe(row, self.total, self.metric))

    def advance(self, env_steps: int) -> None:
        """Lines are logged at metrics rows only."""

    def close(self) -> None:
        """Nothing to release."""

    @contextlib.contextmanager
    def redirect_logging(self) -> Iterator[None]:
        yield


class BarProgress:
    """A tqdm bar over env steps; its postfix shows the training return and ``metric``.

    It stops at ``total``: the last vector step of a run may take it past.
    """

    def __init__(self, total: int, initial: int = 0, metric: str = EVAL) -> None:
        from tqdm.auto import tqdm

        self.total = total
        self.metric = metric
        self.bar = tqdm(
            total=total,
            initial=min(initial, total),
            unit="step",
            unit_scale=True,
            dynamic_ncols=True,
        )

    def update(self, row: Mapping[str, float]) -> None:
        self.bar.update(min(int(row["env_steps"]), self.total) - self.bar.n)
        self.bar.set_postfix_str(_returns(row, self.metric), refresh=True)

    def advance(self, env_steps: int) -> None:
        """Move by ``env_steps`` within a metrics row."""
        self.bar.update(min(env_steps, self.total - self.bar.n))

    def close(self) -> None:
        self.bar.close()

    @contextlib.contextmanager
    def redirect_logging(self) -> Iterator[None]:
        """Log records are written above the bar instead of through it."""
        from tqdm.contrib.logging import logging_redirect_tqdm

        with logging_redirect_tqdm(loggers=[logging.getLogger("corral")]):
            yield


def progress(total: int, initial: int = 0, bar: bool = True, metric: str = EVAL) -> Any:
    """A tqdm bar when ``bar`` is true and tqdm is installed, else a line logger.

    ``metric`` is the evaluation column shown (the one that selects ``best.pt``).
    """
    if bar:
        try:
            return BarProgress(total, initial, metric)
        except ModuleNotFoundError:
            log.info("tqdm is not installed: progress is logged line by line")
    return LineProgress(total, initial, metric)


def describe(row: Mapping[str, float], total: int, metric: str = EVAL) -> str:
    """One line: ``steps 4,000/10,000 | 2,345 steps/s | return 1.2 | eval 3.4``;
    another ``metric`` than ``eval_return`` shows under its name."""
    parts = [f"steps {int(row['env_steps']):,}/{total:,}"]
    if "steps_per_s" in row:
        parts.append(f"{row['steps_per_s']:,.0f} steps/s")
    text = _returns(row, metric)
    return " | ".join([*parts, text] if text else parts)


def _returns(row: Mapping[str, float], metric: str) -> str:
    parts = []
    if "train_return" in row:
        parts.append(f"return {row['train_return']:.3g}")
    if metric in row:
        parts.append(f"{'eval' if metric == EVAL else metric} {row[metric]:.3g}")
    return " | ".join(parts)
