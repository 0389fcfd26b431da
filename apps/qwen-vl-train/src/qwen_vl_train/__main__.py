from qwen_vl_train.cli import run

run()
