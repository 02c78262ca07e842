# session 16 call 1: the RMS norm fused into the F16 matvecs (QKV, gate/up) and the
# O/down matvecs adding into the residual (FERROX_CUDA_NORM_FUSE=0 turns both off);
# GPU tests, the sabotaged build, 1b decode A/B (F16, Q8_0, Q4_K) against main (BASE=1)
D=target/h-cuda24
R=$OUT
export FERROX_REQUIRE_GPU=1
echo "sabotaged (norm scale dropped; acc ignored):"
timeout 100 $D/tests-sabotaged/ferrox_core backend::cuda::tests::fused_norm --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" | head -4
OUT=$R/dev D=$D KINDS="F16 Q8_0 Q4_K" ROUNDS=2 VARIANTS=";FERROX_CUDA_NORM_FUSE=0;BASE=1" TEST_VARIANTS="FERROX_CUDA_NORM_FUSE=0" TRACE_KINDS="F16" bash scripts/cuda-dev.sh 2>&1 | grep -v "^F16 \[\|^Q8_0 \[\|^Q4_K \["
grep -E "^test .*(FAILED|ok)$" $R/dev/tests.log | grep -c ok
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
