# session 16 call 5: one streaming block an SM (FERROX_CUDA_STREAM_BLOCKS=1, launch bound
# unchanged) leaves room for the next kernel's block while this one runs
D=target/h-cuda24
R=$OUT
export FERROX_REQUIRE_GPU=1
OUT=$R/1b D=$D SKIP_TESTS=1 KINDS="F16 Q8_0" ROUNDS=2 VARIANTS=";FERROX_CUDA_STREAM_BLOCKS=1" bash scripts/cuda-dev.sh 2>&1 | grep median
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=1 VARIANTS=";FERROX_CUDA_STREAM_BLOCKS=1" bash scripts/cuda-dev.sh 2>&1 | grep median
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
