"""A run's life on disk and in time: where it writes, how it starts, resumes, saves and stops.

- ``directory``, ``lock``: the run's directories, their lease lock, and where a run starts.
- ``resume_settings``: a resume compared with the settings its checkpoint was trained with.
- ``saved_config``: the config a run saved beside its checkpoints, for tools that read its results.
- ``checkpoint_saves``: full and model-only saves, synchronous or in the background.
- ``stop_signals``, ``exit_codes``: SIGTERM / SIGINT as a request to stop; what the process returns.
- ``torchrun``: the launch scripts' torchrun, which passes a stopped run's exit code on to the scheduler.
- ``user_errors``: the errors a user fixes (a config, a lock, a file, a package, Ctrl-C): one clean
  message from one rank and an exit code of their class; any other exception is a bug, with its traceback.
- ``summary``: the lines that say where a run writes, at its start and end.
"""
