# session 18 call 7: branch h/cuda23-opf — the F16/int8 streaming matvec that adds into the residual
# and whose matrix is at most FERROX_O_PF_MAX bytes (the output projection; at 1b also down) brings its
# warps' rows towards L2 before PDL_ENTER, while the decode attention runs on 32 of 132 SMs
# (FERROX_CUDA_DEFINES=FERROX_O_PF=1; default build = main's kernels). 8b and 1b F16 tg128, and a trace.
D=target/h-cuda32
R=$OUT
export FERROX_REQUIRE_GPU=1 FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache
OUT=$R/1b D=$D SKIP_TESTS=1 SHAPE=llama-1b KINDS="F16" ROUNDS=2 VARIANTS=";FERROX_CUDA_DEFINES=FERROX_O_PF=1;FERROX_CUDA_DEFINES=FERROX_O_PF=1,FERROX_O_PF_MAX=20000000LL" bash scripts/cuda-dev.sh 2>&1 | grep -E "median"
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=2 VARIANTS=";FERROX_CUDA_DEFINES=FERROX_O_PF=1" TRACE_KINDS=F16 TRACE_DEFINES=FERROX_O_PF=1 bash scripts/cuda-dev.sh 2>&1 | grep -E "median|step|rc="
rm -f $R/8b/trace-*.txt
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
