"""A run's check that its model files belong together, before any model is built or any weight read.

Some model families ship in parts that must match: LTX-2's transformer release and the text side its cached
text embeddings were encoded with (an LTX-2.5 transformer takes Gemma-4's, through 2.5's connectors). Only the
app knows which parts go together, so the trainer asks the model container class: its classmethod
``model_set_problems(config)`` returns one line per mismatch, naming the files and what was expected,
reading configs only (no weights). A container without the hook is not checked.
"""

from __future__ import annotations

from typing import Any

from mm_trainer.model.container import container_class

__all__ = ["ModelSetError", "check_model_set"]


class ModelSetError(ValueError):
    """Model files of a run (or a command's model folder) that do not belong together: exit 66."""

    raised_on_every_rank = True  # every rank reads the same files: rank 0 alone prints it


def check_model_set(config: Any) -> None:
    """Refuse ``config`` when its model container class finds model files that do not go together.

    Raises:
        ModelSetError: one line per problem the container's ``model_set_problems(config)`` returns.
    """
    hook = getattr(container_class(config.model), "model_set_problems", None)
    problems = list(hook(config)) if callable(hook) else []
    if problems:
        raise ModelSetError("\n".join(problems))
