# session 17 call 2: h/cuda18-int8norm (merged with main; test tolerance of the epilogue's attention
# output 1e-3) GPU tests; decode A/B of the int8 fused norm against main (BASE=1): 1b Q8_0/Q4_0/Q4_K,
# 8b Q8_0; the host's share of a decode step: one Llama-1b layer under the 128256 vocabulary
# (llama-1l) and llama-tiny (vocab 1024), F16, with the read in pieces and in one (FERROX_CUDA_READ=1).
# (llama-1l is a shape added to the carried copy of make_synthetic_gguf.py: hidden 2048, 1 layer, 32/8 heads of 64, ffn 8192, vocab 128256, tied)
D=target/h-cuda26
R=$OUT
export FERROX_REQUIRE_GPU=1 FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache
mkdir -p $R/tests
timeout 150 $D/tests/ferrox_core backend:: --test-threads=1 --nocapture >$R/tests/branch.log 2>&1
echo "branch tests rc=$?: $(grep -E '^test result' $R/tests/branch.log | tail -1)"; grep -E "NOT CHECKED|panicked|FAILED" $R/tests/branch.log | head -6
for s in llama-tiny llama-1l; do
  OUT=$R/$s D=$D SKIP_TESTS=1 SHAPE=$s KINDS="F16" ROUNDS=2 REPS=5 VARIANTS=";FERROX_CUDA_READ=1;BASE=1" bash scripts/cuda-dev.sh 2>&1 | grep median
done
OUT=$R/1b D=$D SKIP_TESTS=1 KINDS="Q8_0 Q4_0 Q4_K" ROUNDS=2 VARIANTS=";BASE=1" bash scripts/cuda-dev.sh 2>&1 | grep median
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="Q8_0" ROUNDS=2 VARIANTS=";BASE=1" bash scripts/cuda-dev.sh 2>&1 | grep median
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
