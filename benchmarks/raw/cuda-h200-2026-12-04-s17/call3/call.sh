# session 17 call 3: the decode attention's split and chunk knobs at short contexts (tg128 from
# depth 0, where no token is split at the default chunk and span of 128: a span is at least a chunk), 1b F16 / Q4_0 and 8b F16, main's
# build (ferrox-base); the 1b F16 trace.
D=target/h-cuda26
R=$OUT
export FERROX_REQUIRE_GPU=1 FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache
cp $D/ferrox-base $D/ferrox
V=";FERROX_CUDA_DEC_CHUNK=64;FERROX_CUDA_DEC_CHUNK=32;FERROX_CUDA_DEC_CHUNK=64 FERROX_CUDA_DEC_SPAN=64;FERROX_CUDA_DEC_CHUNK=32 FERROX_CUDA_DEC_SPAN=32"
OUT=$R/1b D=$D SKIP_TESTS=1 KINDS="F16 Q4_0" ROUNDS=2 VARIANTS="$V" TRACE_KINDS="F16" bash scripts/cuda-dev.sh 2>&1 | grep -v "^F16 \[\|^Q4_0 \["
python3 tools/cuda/trace.py $R/1b/trace-F16.txt --positions 200 | tail -4
rm -f $R/1b/trace-F16.txt
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=1 VARIANTS="$V" bash scripts/cuda-dev.sh 2>&1 | grep median
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
