# session 16 call 2: 8b F16 decode A/B of the fused norm / residual matvecs against main, and its trace
D=target/h-cuda24
R=$OUT
export FERROX_REQUIRE_GPU=1
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=2 VARIANTS=";BASE=1" TRACE_KINDS="F16" bash scripts/cuda-dev.sh 2>&1 | grep -v "^F16 \["
rm -f $R/8b/trace-F16.txt
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
