#!/bin/sh
# Engine capacity on a lent GPU (the device tool's H200), prepared to finish in under 8 minutes.
#
# Here, once: the GPU image has torch but not piper-tts (the TTS phonemizer), so carry it:
#   mkdir -p .device/site && rsync -a --exclude hebrew --exclude tashkeel --exclude train \
#       .venv/lib/python3.11/site-packages/piper .device/site/ && echo /.device/ >> .git/info/exclude
# Then: run(command="sh bench/gpu_capacity.sh", carry=[".device"], timeout_s=540)
# Results come back in $OUT: engine_capacity_gpu.json (same fields as the CPU run) and its log.
set -u
export PYTHONPATH="$PWD:$PWD/.device/site" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
tts_flag=""
python3 -c "import piper.phonemize_espeak" 2>/dev/null || tts_flag="--no-tts"  # listening-only if piper did not travel
timeout 450 python3 bench/engine_capacity.py --device cuda --sizes 1,64,256,1024,2048 --seconds 8 --warm-up 2 \
    --no-stop $tts_flag --note "device tool, $(head -2 "$OUT/gpu.txt" | tail -1)" \
    > "$OUT/engine_capacity_gpu.json" 2> "$OUT/engine_capacity_gpu.log"
echo "exit $?"
tail -5 "$OUT/engine_capacity_gpu.log"
