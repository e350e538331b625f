"""The groups that run a job's workers: the Group protocol (``api``), the books every
group keeps (``base``), the ``tidal`` launcher's in-place rescale (``elastic``),
torchrun's restart-based group, the replicas of tf/mpi/ps roles, and a multi-role job's
group per role."""
