# session 16 call 4: registers of the streaming kernels (ptxas -v on the cached PTX), and
# decode with tighter launch bounds (FERROX_F16S_MINB 3/4: room on an SM for the next
# kernel's blocks while this one's two run, so its early loads and norm prologue overlap)
D=target/h-cuda24
R=$OUT
export FERROX_REQUIRE_GPU=1
OUT=$R/1b D=$D SKIP_TESTS=1 KINDS="F16" ROUNDS=2 VARIANTS=";FERROX_CUDA_DEFINES=FERROX_F16S_MINB=3;FERROX_CUDA_DEFINES=FERROX_F16S_MINB=4;FERROX_CUDA_DEFINES=FERROX_F16S_MINB=4,F16S_STEP=4,F16S_GSTEP=2" bash scripts/cuda-dev.sh 2>&1 | grep median
for p in /tmp/ferrox-cuda-cache/*.ptx; do
  echo "== $p $(grep -c . $p) lines"; ptxas -arch=sm_90 -v $p -o /tmp/x.cubin 2>&1 | grep -A1 -E "Compiling entry function '(matvec_f16|mmvq_stream_q8_0|mmvq_stream_q4_k|attention_dec|rope_kv|add_rms_norm)" | grep -E "entry|registers" | paste - - | sed -E 's/ptxas info *: //g; s/Compiling entry function//; s/Function properties for//' | head -20
done 2>&1 | head -60
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=1 VARIANTS=";FERROX_CUDA_DEFINES=FERROX_F16S_MINB=3;FERROX_CUDA_DEFINES=FERROX_F16S_MINB=4" bash scripts/cuda-dev.sh 2>&1 | grep median
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
