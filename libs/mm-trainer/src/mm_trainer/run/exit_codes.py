"""Exit codes of a training process (``mm-train`` and the apps' commands), for schedulers and
torchrun's restart policy. Documented in the mm-trainer README, "How a multi-rank run ends"; which
errors end with which code: :mod:`mm_trainer.run.user_errors`. Apart from 1 and 2 they are the codes
of sysexits.h, which schedulers and shells already know."""

EXIT_FINISHED = 0
"""The run reached ``training.train_iters`` (its last checkpoint saved, where ``training.save`` is set)."""

EXIT_FAILED = 1
"""An exception that is not a user error (a bug, a lost peer, a non-finite loss) ended this rank; it
is printed with its traceback and its rank. Nothing more is saved."""

EXIT_CONFIG = 2
"""The config or the command line is refused (also: a resume whose config disagrees with what its
checkpoint trained, a ``training.resume`` the run directory cannot honour). Nothing was started."""

EXIT_REWARD = 65
"""``EX_DATAERR``: a reward (``training.rewards``) raised or scored NaN / inf on a sample, with
``training.reward_failure: stop``; the message names the reward and the sample. Nothing more is saved."""

EXIT_INPUT = 66
"""``EX_NOINPUT``: a file the command reads is missing or unreadable (a checkpoint, one of its shards,
the config saved beside it, a data cache shard), or holds something else than asked for (``--ema``
of a run trained without EMA)."""

EXIT_DEPENDENCY = 69
"""``EX_UNAVAILABLE``: an optional package the config or the command needs is not installed (peft for
LoRA, transformers for an HF model, tensorboard, matplotlib)."""

EXIT_DESTINATION = 73
"""``EX_CANTCREAT``: where the command writes is taken: the run directory is locked by another live
run, or an export destination holds files no export wrote. Nothing was written."""

EXIT_INCOMPLETE = 75
"""The run stopped before ``training.train_iters`` (SIGTERM / SIGINT on any rank, a lost launcher, a stop
request) after saving the iteration it reached: not finished, resume it. 75 is ``EX_TEMPFAIL`` of
sysexits.h ("try again later"): non-zero, so a scheduler does not count the job as done and
torchrun's ``--max-restarts`` restarts it."""

EXIT_INTERRUPTED = 130
"""Ctrl-C (SIGINT) outside the training loop (while a command builds, converts, exports, samples), as
shells report it (128 + 2). Inside the loop a Ctrl-C is a stop: it saves and exits 75."""
