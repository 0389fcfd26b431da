from mm_trainer.cli import run

run()
