#!/usr/bin/env bash
# The prepared GPU check for a session that is lent a device machine (the H200; see the device tool).
# It is the unblocking check of benchmarks/wan_step.py's target (WanDiT <= 0.9x diffusers' step time),
# which a CPU cannot show (benchmarks/README.md), and the first run of the CUDA training path.
#
# Here, once (PyPI reachable; writes .whl/, ignored by git):
#     bash benchmarks/device_check.sh --fetch-wheels
# Then one device call from the repo root:
#     run(command="bash benchmarks/device_check.sh", carry=[".whl"], timeout_s=540)
# Results come back in $OUT: wan_step_bf16.txt, wan_step_fp32.txt, train.txt (+ metrics.jsonl).
# PYTHON and DEVICE override the interpreter and device (DEVICE=cpu: a quick dry run of this script).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
# what the device image lacks (its list: the device tool's KINDS.md); Python 3.12, manylinux x86-64
WHEELS=(diffusers==0.42.1 importlib_metadata pydantic==2.14.4 pydantic_core==2.50.5 annotated_types typing_inspection av==18.1.0)

if [[ "${1:-}" == --fetch-wheels ]]; then
    mkdir -p .whl
    grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "${WHEELS[@]}"
    ls -la .whl
    exit 0
fi

if [[ "$DEVICE" == cuda ]] && compgen -G ".whl/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
for src in libs/*/src apps/*/src; do PYTHONPATH="${PYTHONPATH:-}:$PWD/$src"; done
export PYTHONPATH PYTHONUNBUFFERED=1
out=${OUT:-/tmp/device_check}
mkdir -p "$out"
"$PYTHON" -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"

if [[ "$DEVICE" == cuda ]]; then size=(--grid 8 32 48 --repeats 10 --warmup 3); else size=(--grid 1 8 8 --repeats 1); fi
# 1. One training step, ours vs diffusers vs the matmul skeleton, bf16 and fp32
"$PYTHON" benchmarks/wan_step.py --device "$DEVICE" --dtype bfloat16 "${size[@]}" | tee "$out/wan_step_bf16.txt"
"$PYTHON" benchmarks/wan_step.py --device "$DEVICE" --dtype float32 "${size[@]}" | tee "$out/wan_step_fp32.txt"

# 2. The tiny Wan2.2 run on one device (world 1, no CP): make-tiny, 20 steps, sample a clip
tiny=/tmp/device_check_tiny
"$PYTHON" -m wan22_train make-tiny "$tiny" > /dev/null
mapfile -t overrides < <("$PYTHON" -c "from wan22_train.tiny import tiny_overrides; print('\n'.join(tiny_overrides('$tiny')))")
rm -rf "$tiny/ckpt"
"$PYTHON" -m wan22_train --config apps/wan22-train/configs/tiny_t2v.yaml "${overrides[@]}" \
    training.device="$DEVICE" parallel.ulysses_parallel_size=1 training.train_iters=20 training.save="$tiny/ckpt" \
    2>&1 | tee "$out/train.txt"
cp "$tiny/ckpt/metrics.jsonl" "$out/metrics.jsonl"
"$PYTHON" -m wan22_train sample --checkpoint "$tiny/ckpt" --prompt "a red square" --out "$out/sample.mp4" | tee -a "$out/train.txt"
