# next session's first call: the warp-walked decode attention (branch h/cuda16-warp, unrun)
D=target/h-cuda20
OUT_R=$OUT
OUT=$OUT_R/dev D=$D SABOTAGE=0 TEST_VARIANTS="FERROX_CUDA_DEC_WARP=1;FERROX_CUDA_DEC_WARP=1 FERROX_CUDA_DEC_SPLIT=1" KINDS="F16 Q4_0" DEPTH="0,1024,4096" ROUNDS=2 \
  VARIANTS=";FERROX_CUDA_DEC_WARP=1;BASE=1" bash scripts/cuda-dev.sh 2>&1 | grep -v "^F16 \[\|^Q4_0 \["
OUT=$OUT_R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" DEPTH="0,4096" VARIANTS=";FERROX_CUDA_DEC_WARP=1" bash scripts/cuda-dev.sh 2>&1 | grep median
# the sabotage (acc not rescaled by the running max's correction) only shows with the warp kernel on:
FERROX_CUDA_DEC_WARP=1 FERROX_REQUIRE_GPU=1 timeout 100 $D/tests-sabotaged/ferrox_core backend::cuda::tests::attention --test-threads=1 2>&1 | grep -E "^test result|panicked" | head -3
