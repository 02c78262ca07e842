# session 16 call 3: the residual matvecs read what they add to with their weights (the
# y read at a row's end stalled the warp); tests, sabotage, 1b and 8b decode A/B against main
D=target/h-cuda24
R=$OUT
export FERROX_REQUIRE_GPU=1
echo "sabotaged (norm scale dropped; acc ignored):"
timeout 100 $D/tests-sabotaged/ferrox_core backend::cuda::tests::fused_norm --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" | head -4
OUT=$R/dev D=$D KINDS="F16 Q8_0 Q4_K" ROUNDS=2 VARIANTS=";BASE=1" TEST_VARIANTS="FERROX_CUDA_NORM_FUSE=0" TRACE_KINDS="F16" bash scripts/cuda-dev.sh 2>&1 | grep -v "^F16 \[\|^Q8_0 \[\|^Q4_K \["
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16 Q8_0" ROUNDS=2 VARIANTS=";BASE=1" TRACE_KINDS="F16" bash scripts/cuda-dev.sh 2>&1 | grep -v "^F16 \[\|^Q8_0 \["
rm -f $R/8b/trace-F16.txt $R/dev/trace-F16.txt
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
