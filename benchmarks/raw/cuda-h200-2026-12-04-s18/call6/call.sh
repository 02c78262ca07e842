# session 18 call 6: where attention_o_f16's 30 us go (8b F16, shared memory capped at 90000 bytes).
# Decode with stages left out (FERROX_CUDA_DEFINES AO_NO_ATTN=1: no attention; AO_NO_RED=1: no
# reduction of the partial sums; both; timing only, wrong results), the launches apart for
# reference; then ncu on two launches of attention_o_f16 and of attention_dec and the O matvec.
D=target/h-cuda31
R=$OUT
export FERROX_REQUIRE_GPU=1 FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache FERROX_CUDA_ATTN_O_SMEM=90000
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=1 VARIANTS=";FERROX_CUDA_DEFINES=AO_NO_ATTN=1;FERROX_CUDA_DEFINES=AO_NO_RED=1;FERROX_CUDA_DEFINES=AO_NO_ATTN=1,AO_NO_RED=1;FERROX_CUDA_ATTN_O_KEYS=0" bash scripts/cuda-dev.sh 2>&1 | grep -E "median|rc="
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
timeout 150 ncu --clock-control none -k regex:attention_o_f16 -s 40 -c 2 $S $D/ferrox bench --backend cuda -m /tmp/models/F16.gguf -p 0 -n 8 -r 1 >$R/8b/ncu-ao.txt 2>&1; echo "ncu ao rc=$?"
FERROX_CUDA_ATTN_O_KEYS=0 timeout 150 ncu --clock-control none -k regex:"attention_dec|matvec_f16_stream" -s 120 -c 4 $S $D/ferrox bench --backend cuda -m /tmp/models/F16.gguf -p 0 -n 8 -r 1 >$R/8b/ncu-apart.txt 2>&1; echo "ncu apart rc=$?"
for f in $R/8b/ncu-ao.txt $R/8b/ncu-apart.txt; do grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued|Dynamic Shared|Block Limit Shared|L1/TEX Hit|L2 Hit" $f | head -40; done
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
