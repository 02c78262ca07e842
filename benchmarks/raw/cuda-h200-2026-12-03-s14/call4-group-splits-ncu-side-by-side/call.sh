# call 4 (target/h-cuda17: commit 3 of the branch, before the token-innermost layout; span 256)
D=target/h-cuda17
LL=/tmp/llama; mkdir -p $LL /tmp/logs
# (llama.cpp built in the background as in scripts/cuda-side-by-side.sh)
OUT=/tmp/o3a D=$D SABOTAGE=1 TEST_VARIANTS="FERROX_CUDA_DEC_SPLIT_HEADS=1;FERROX_CUDA_DEC_HEADS=0" KINDS="F16 Q4_0" DEPTH="0,1024,4096" ROUNDS=2 \
  VARIANTS=";FERROX_CUDA_DEC_SPLIT_HEADS=1;FERROX_CUDA_DEC_SPLIT=32 FERROX_CUDA_DEC_SPAN=128;FERROX_CUDA_DEC_SPLIT=1" bash scripts/cuda-dev.sh
for v in "" "FERROX_CUDA_DEC_SPLIT_HEADS=1"; do
  env $v timeout 200 ncu --clock-control none --cache-control none -k regex:attention_dec --launch-skip 40 -c 2 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats \
    $D/ferrox bench --backend cuda -m /tmp/models/F16.gguf -p 0 -n 8 -d 4096 -r 1 > /tmp/o3a/ncu-attn-$v.txt 2>&1
done
OUT=/tmp/o3c D=$D SKIP_TESTS=1 SKIP_KB=1 KINDS=" " RUN_CHECK=0 DEPTH="0,4096" REPS=3 LOG=/tmp/o3c bash scripts/cuda-side-by-side.sh
OUT=/tmp/o3b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" DEPTH="0,4096" \
  VARIANTS=";FERROX_CUDA_DEC_SPLIT=32 FERROX_CUDA_DEC_SPAN=128;FERROX_CUDA_DEC_CHUNK=64;FERROX_CUDA_DEC_SPLIT_HEADS=1" bash scripts/cuda-dev.sh
