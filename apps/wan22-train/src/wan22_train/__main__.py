from wan22_train.cli import run

run()
