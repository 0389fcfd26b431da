"""``python -m mm_checkpoint`` runs the ``mm-ckpt`` CLI."""

from .cli import run

run()
