# session 18 call 2: tools/cuda/boundary_bench.cu (8b F16's matvec shapes streamed as a chain of PDL
# launches, plain launches, or phases of one persistent kernel with grid barriers; plus no barrier at
# all, timing only), then main's (a38e42d) 8b F16 decode in the same call: tg128 and the in-graph trace.
D=target/h-cuda30
R=$OUT
mkdir -p $R/bb
(nvcc -O3 -arch=sm_90 -o /tmp/bbd tools/cuda/boundary_bench.cu && echo built there) 2>&1 | tail -2
B=/tmp/bbd; [ -x $B ] || B=$D/bb
$B 32 20 2>&1 | tee $R/bb/bb32.txt
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=2 VARIANTS="" TRACE_KINDS=F16 bash scripts/cuda-dev.sh 2>&1 | grep -E "median|step|rc="
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
