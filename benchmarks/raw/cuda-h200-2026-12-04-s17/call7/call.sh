# session 17 call 7: branch h/cuda21-oflag — the F16 output projection waits on the decode
# attention's blocks (a flag: FLAG_ENTER / block_done), not on the attention grid's end.
# GPU tests, the sabotaged build (the projection not waiting at all), decode A/B 1b F16 against
# FERROX_CUDA_O_FLAG=0 and main (BASE=1), then 8b F16 as far as the device time goes.
D=target/h-cuda29
R=$OUT
export FERROX_REQUIRE_GPU=1 FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache
mkdir -p $R/tests
timeout 100 $D/tests/ferrox_core backend:: --test-threads=1 --nocapture >$R/tests/tests.log 2>&1
echo "tests rc=$?: $(grep -E '^test result' $R/tests/tests.log | tail -1)"; grep -E "NOT CHECKED|panicked|FAILED" $R/tests/tests.log | head -6
echo "sabotaged (no wait):"; timeout 60 $D/sab/ferrox_core backend::cuda::tests::output_projection backend::cuda::tests::greedy --test-threads=1 2>&1 | grep -E "^test |^test result" | head -4
OUT=$R/1b D=$D SKIP_TESTS=1 KINDS="F16" ROUNDS=2 VARIANTS=";FERROX_CUDA_O_FLAG=0;BASE=1" bash scripts/cuda-dev.sh 2>&1 | grep median
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=1 VARIANTS=";BASE=1" bash scripts/cuda-dev.sh 2>&1 | grep median
