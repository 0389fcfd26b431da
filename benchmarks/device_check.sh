#!/usr/bin/env bash
# The prepared GPU check for a session that is lent a device machine (the H200; see the device tool).
# 1. ring-attention block kernels vs the math reference, one table (cp_kernel_check.py): torch's flash
#    and memory-efficient kernels (+ flash_attn if installed), output / LSE / gradients, fp32 and bf16,
#    causal or not, with and without padded keys; then the ring merge over simulated blocks;
# 2. the per-block memory model measured on the GPU (cp_memory.py --validate --device cuda);
# 3. benchmarks/wan_step.py in bf16 and fp32 (its target, WanDiT <= 0.9x diffusers' step time, needs a GPU);
# 4. the tiny Wan2.2 run on one GPU (the CUDA training path) and a sampled clip;
# 5. the Ulysses all-to-all overlap, off vs head groups vs projections (cp_attention.py --overlap 1 2 p1 p2:
#    two ranks sharing the one GPU over gloo, whose all-to-all is staged through host memory, so it times
#    overlap with a slower link than NVLink; it decides mm_parallel.ulysses.OVERLAP_HEADS_DEFAULT["cuda"]
#    and OVERLAP_PROJECTIONS_DEFAULT["cuda"]);
# 6. one GPU at Wan-14B width (dim 5120, 40 heads, ffn 13824): packed vs padded step time of a 2-block
#    stack on the mixed set (packed_step.py: the packed attention's CUDA varlen kernel), and the MFU of
#    2 blocks at 480p x 81 frames, 32760 tokens (wan_step.py's MFU line).
# The exit status is 1 when a kernel row or the memory model is off (the later stages still run).
#
# Here, once (PyPI reachable; writes .whl/, ignored by git):
#     bash benchmarks/device_check.sh --fetch-wheels
# Then one device call from the repo root:
#     run(command="bash benchmarks/device_check.sh", carry=[".whl"], timeout_s=540)
# Results come back in $OUT: cp_kernels.txt, cp_memory.txt, wan_step_bf16.txt, wan_step_fp32.txt, train.txt
# (+ metrics.jsonl, sample.mp4), cp_overlap.txt, packed_step.txt, wan_mfu.txt. PYTHON and DEVICE override the interpreter and device; DEVICE=cpu is the dry
# run: the same stages on the smallest shapes (bf16 step only, 2 training steps, no sampling; about 40 s of CPU on a 2-core machine).
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
if [[ "$DEVICE" == cuda ]]; then
    size=(--grid 8 32 48 --repeats 10 --warmup 3); dtypes=(bfloat16 float32); kernels=(); memory=(--shape 8192 8192 4 128)
    steps=20
    overlap=(--overlap 1 2 p1 p2 --seq 16384 --heads 16 --dim 64 --layers 2 --repeats 5)  # not yet timed on a GPU
    wide=(--dim 5120 --heads 40 --ffn-dim 13824 --blocks 2 --text-dim 4096 --text-len 512 --dtype bfloat16)
    packed=(--samples 16 --micro-batch 4 --scale 2 --repeats 2); mfu=(--grid 21 30 52 --repeats 3 --warmup 1)
else
    size=(--grid 1 4 4 --blocks 1 --dim 64 --heads 2 --ffn-dim 128 --text-dim 32 --text-len 8 --repeats 1 --warmup 0)
    dtypes=(bfloat16); kernels=(--small); memory=(--shape 1024 1024 2 64); steps=2
    overlap=(--overlap 1 2 p2 --seq 256 --heads 4 --dim 16 --layers 1 --repeats 1 --what stack)
    wide=(--dim 64 --heads 2 --ffn-dim 128 --blocks 1 --text-dim 32 --text-len 8 --dtype bfloat16)
    packed=(--samples 4 --micro-batch 2 --repeats 1); mfu=(--grid 1 4 4 --repeats 1 --warmup 0)
fi
status=0
# 1. Ring-attention block kernels and the ring merge vs math (one table; a FAIL row fails the script at the end)
"$PYTHON" benchmarks/cp_kernel_check.py --device "$DEVICE" "${kernels[@]}" | tee "$out/cp_kernels.txt" || status=1
# 2. The per-block memory model against this device's allocator
"$PYTHON" benchmarks/cp_memory.py --validate --device "$DEVICE" "${memory[@]}" | tee "$out/cp_memory.txt" || status=1

# 3. One training step, ours vs diffusers vs the matmul skeleton (bf16; fp32 too on the GPU)
for dtype in "${dtypes[@]}"; do
    "$PYTHON" benchmarks/wan_step.py --device "$DEVICE" --dtype "$dtype" "${size[@]}" | tee "$out/wan_step_${dtype/bfloat16/bf16}.txt"
done

# 4. The tiny Wan2.2 run on one device (world 1, no CP): make-tiny, train (+ sample a clip on the GPU).
#    make-tiny and training share one interpreter (its torch / diffusers imports are a third of the dry run)
tiny=/tmp/device_check_tiny
rm -rf "$tiny"
"$PYTHON" - apps/wan22-train/configs/tiny_t2v.yaml training.device="$DEVICE" parallel.ulysses_parallel_size=1 \
    training.train_iters="$steps" training.save="$tiny/ckpt" <<EOF 2>&1 | tee "$out/train.txt"
import sys
from mm_trainer.cli import run
from wan22_train.cli import main
from wan22_train.tiny import make_tiny, tiny_overrides
make_tiny("$tiny")
run(lambda: main(["--config", sys.argv[1], *tiny_overrides("$tiny"), *sys.argv[2:]]))
EOF
cp "$tiny/ckpt/metrics.jsonl" "$out/metrics.jsonl"
if [[ "$DEVICE" == cuda ]]; then
    "$PYTHON" -m wan22_train sample --checkpoint "$tiny/ckpt" --prompt "a red square" --out "$out/sample.mp4" \
        | tee -a "$out/train.txt"
fi

# 5. Ulysses all-to-all overlap off (1) vs 2 head groups vs the projections (p1, p2): forward, and forward + backward
"$PYTHON" benchmarks/cp_attention.py --device "$DEVICE" "${overlap[@]}" | tee "$out/cp_overlap.txt"

# 6. One GPU, Wan-14B-width blocks: packed vs padded step time on the mixed set, then the MFU at 32760 tokens
"$PYTHON" benchmarks/packed_step.py --device "$DEVICE" "${wide[@]}" "${packed[@]}" | tee "$out/packed_step.txt"
"$PYTHON" benchmarks/wan_step.py --device "$DEVICE" "${wide[@]}" "${mfu[@]}" | tee "$out/wan_mfu.txt"
exit $status
