"""``python -m mm_trainer.run.torchrun [torchrun options] -m MODULE ...``: torchrun whose exit code tells
a stopped run from a failed one.

torchrun counts every worker that exits non-zero as failed and then exits 1 itself, so the exit code
of a run that stopped and saved (:data:`~mm_trainer.run.exit_codes.EXIT_INCOMPLETE`, 75: resume it)
never reaches the scheduler: it sees 1, as for a crash. This launcher is torchrun (its own code,
``torch.distributed.run``, with the same options, run in this process) with its ending mapped:

- every worker that ended non-zero ended with ``EXIT_INCOMPLETE`` (a stop: SIGTERM / SIGINT on a
  rank, a stop request): exit ``EXIT_INCOMPLETE``;
- the launcher itself received SIGTERM / SIGINT / SIGHUP (a scheduler's stop, a time limit): torchrun
  sends it on to the workers, which save the iteration they reached; exit ``EXIT_INCOMPLETE``;
- every worker that exited non-zero (rather than being stopped by torchrun's signal once the first
  had failed) exited with one and the same user-error code (``EXIT_CONFIG``, ``EXIT_INPUT``,
  ``EXIT_DEPENDENCY``, ``EXIT_DESTINATION``, ``EXIT_INTERRUPTED``: an error the user fixes, whose
  message a worker has printed): exit that code, with one line instead of torchrun's failure summary;
- anything else exits as torchrun does: 0 when every worker finished, else 1 with torchrun's summary
  of the failure (its error file too).

The launch scripts (``launch/slurm.sbatch``, ``launch/ascend.sh``) start runs through it; the SLURM one
requeues the job on ``EXIT_INCOMPLETE``. Documented in the mm-trainer README, "How a multi-rank run ends".
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from mm_trainer.run.exit_codes import EXIT_FINISHED, EXIT_INCOMPLETE
from mm_trainer.run.user_errors import CLASSES

USER_ERROR_CODES = tuple(kind.exit_code for kind in CLASSES)
"""The exit codes of errors the user fixes (``mm_trainer.run.user_errors``), passed on as they are."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run torchrun with ``argv`` (its command line); the exit code, mapped as the module docstring says."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
    from torch.distributed.run import parse_args, run

    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        record(run)(args)  # record: torchrun's error file and summary of a failed worker, as torchrun writes
    except ChildFailedError as err:
        codes = sorted({failure.exitcode for failure in err.failures.values()})
        if codes == [EXIT_INCOMPLETE]:
            _say(f"every worker that ended early exited {EXIT_INCOMPLETE} (EXIT_INCOMPLETE): the run stopped")
            return EXIT_INCOMPLETE
        exited = [code for code in codes if code >= 0]  # the others: stopped by torchrun's signal after
        if len(exited) == 1 and exited[0] in USER_ERROR_CODES:
            sys.stderr.write(
                f"mm_trainer.run.torchrun: every worker that exited early exited {exited[0]} (an error to "
                f"fix, told above; torchrun stopped the others); exiting {exited[0]}\n"
            )
            return exited[0]
        raise
    except SignalException as err:
        _say(
            f"received {err.sigval.name}: the workers were stopped with it (they save the iteration they reached)"
        )
        return EXIT_INCOMPLETE
    return EXIT_FINISHED


def _say(what: str) -> None:
    sys.stderr.write(f"mm_trainer.run.torchrun: {what}; exiting {EXIT_INCOMPLETE}: not finished, resume it\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
