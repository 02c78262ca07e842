# call 6: attention_dec occupancy and split-count knobs at depth (main's kernels, FERROX_DEC_MINB added)
D=target/h-cuda19
R=$OUT; mkdir -p $R
export FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache FERROX_REQUIRE_GPU=1
V2="FERROX_CUDA_DEFINES=FERROX_DEC_MINB=3 FERROX_CUDA_DEC_CHUNK=64 FERROX_CUDA_DEC_SPLIT=32"
for v in "" "$V2"; do
  env $v timeout 100 $D/tests/ferrox_core backend::cuda::tests::attention backend::cuda::tests::greedy --test-threads=1 > $R/tests.log 2>&1
  echo "tests [$v] rc=$?: $(grep -E '^test result' $R/tests.log | tail -1)"
done
OUT=$R/1b D=$D SKIP_TESTS=1 KINDS="F16 Q4_0" DEPTH="0,1024,4096" \
  VARIANTS=";FERROX_CUDA_DEC_SPLIT=32;$V2;FERROX_CUDA_DEC_CHUNK=64 FERROX_CUDA_DEC_SPLIT=32" \
  timeout 150 bash scripts/cuda-dev.sh 2>&1 | grep median
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" DEPTH="0,4096" \
  VARIANTS=";FERROX_CUDA_DEC_CHUNK=64 FERROX_CUDA_DEC_SPLIT=32;$V2" timeout 120 bash scripts/cuda-dev.sh 2>&1 | grep median
