from ltx2_train.cli import run

run()
