"""Rollout workers: envs and copies of the policies in Ray actors, sending back whole rollouts.

With ``runners: N`` (see :class:`~corral.training.config.RunConfig`) a run starts N
:class:`~corral.workers.rollout_worker.RolloutWorker` actors, each stepping its shard of
the envs with a copy of every policy that acts there, while the learners stay in the
runner's process (:class:`~corral.workers.worker_set.WorkerSet`): one remote call per
rollout, and the weights put into Ray's object store once per update.
"""
