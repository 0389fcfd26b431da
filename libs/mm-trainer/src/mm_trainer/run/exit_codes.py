"""Exit codes of a training process (``mm-train`` and the apps' train commands), for schedulers and
torchrun's restart policy. Documented in the mm-trainer README, "How a multi-rank run ends"."""

EXIT_FINISHED = 0
"""The run reached ``training.train_iters`` (its last checkpoint saved, where ``training.save`` is set)."""

EXIT_FAILED = 1
"""An exception ended this rank (printed with its rank); nothing more is saved."""

EXIT_INCOMPLETE = 75
"""The run stopped before ``training.train_iters`` (SIGTERM / SIGINT on any rank, a lost launcher, a stop
request) after saving the iteration it reached: not finished, resume it. 75 is ``EX_TEMPFAIL`` of
sysexits.h ("try again later"): non-zero, so a scheduler does not count the job as done and
torchrun's ``--max-restarts`` restarts it."""
