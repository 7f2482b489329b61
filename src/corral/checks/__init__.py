"""The conformance checkers: play an env and list every way it breaks the env contract.

:func:`check_env` checks a dict env (:class:`corral.MultiAgentEnv`, or anything
:func:`corral.adapt` takes) and hands a batched env (:class:`corral.BatchedEnv`) to
:func:`check_batched_env`. Both share one engine (:mod:`corral.checks.engine`: the report,
the findings, how the env is called and how a value is judged against its space); the rules
of the dict contract are in :mod:`corral.checks.env_rules`, those of the batched protocol in
:mod:`corral.checks.batched_rules`. The values an env returns are described and judged by
:mod:`corral.returned_values`, outside this package: the vector layer uses the same rules.
:mod:`corral.checks.watched` runs a check in a child process under a time limit.
"""

from corral.checks.batched_checker import NUM_ENVS, BatchedCheckReport, check_batched_env
from corral.checks.engine import MAX_REPEATS, STEP_CAP, CheckReport, reporting_calls
from corral.checks.env_checker import RandomPolicy, check_env

__all__ = [
    "MAX_REPEATS",
    "NUM_ENVS",
    "STEP_CAP",
    "BatchedCheckReport",
    "CheckReport",
    "RandomPolicy",
    "check_batched_env",
    "check_env",
    "reporting_calls",
]
