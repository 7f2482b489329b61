"""Helpers shared by the test modules (no test module imports another).

``paths`` locates the repository, ``tabular`` and ``runs`` hold a tiny tabular learner
and the runs made with it, ``cli`` drives ``corral.cli.main``, ``checkpoints`` reads and
forges checkpoint files, ``plugins`` writes installed plugin packages, ``games`` holds
small env variants, ``batches`` compares vector batches, ``backends`` lists the vector
backends, ``devices`` counts the learner's host reads, ``host_reads`` counts reads of
tensors, and ``mpe_differential`` holds the checks every batched MPE scenario runs
against mpe2.
"""
