# session 17 call 1: GPU tests of main (a38e42d: whole-head RoPE epilogue, 47 KiB norm cap, both
# unrun) and of h/cuda18-int8norm merged with main (int8 fused norm, partial-rotation epilogue),
# the norm sabotage; then 8b F16 decode A/B of FERROX_STREAM_PF (L2 prefetch of each warp's first
# rows before PDL_ENTER) against main (BASE=1), the trace with the best guess, kernel_bench at the
# head's and O's shapes.
# (the build carried also held FERROX_STREAM_PF, a commit since dropped; the trace below ran with PF=16384, so its figures are inflated)
D=target/h-cuda26
R=$OUT
export FERROX_REQUIRE_GPU=1 FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache
mkdir -p $R/tests
timeout 150 $D/tests-main/ferrox_core backend:: --test-threads=1 --nocapture >$R/tests/main.log 2>&1
echo "main tests rc=$?: $(grep -E '^test result' $R/tests/main.log | tail -1)"; grep -E "NOT CHECKED|panicked|FAILED" $R/tests/main.log | head -6
timeout 150 $D/tests/ferrox_core backend:: --test-threads=1 --nocapture >$R/tests/branch.log 2>&1
echo "branch tests rc=$?: $(grep -E '^test result' $R/tests/branch.log | tail -1)"; grep -E "NOT CHECKED|panicked|FAILED" $R/tests/branch.log | head -6
timeout 100 $D/tests-sabotaged/ferrox_core backend::cuda::tests::fused_norm --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" | head -4
FERROX_CUDA_DEFINES=FERROX_STREAM_PF=16384 timeout 150 $D/tests/ferrox_core backend::cuda::tests::streaming backend::cuda::tests::fused backend::cuda::tests::qkv backend::cuda::tests::every_claimed_kind_matvec backend::cuda::tests::greedy --test-threads=1 >$R/tests/pf.log 2>&1
echo "PF=16384 tests rc=$?: $(grep -E '^test result' $R/tests/pf.log | tail -1)"
PF="FERROX_CUDA_DEFINES=FERROX_STREAM_PF"
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=2 VARIANTS=";$PF=8192;$PF=16384;$PF=32768;BASE=1" \
  TRACE_KINDS="F16" TRACE_DEFINES="FERROX_STREAM_PF=16384" KB_SHAPES="128256x4096 4096x4096 4096x14336" KB_KINDS=F16 KB_VARIANTS=";$PF=16384" \
  bash scripts/cuda-dev.sh 2>&1 | grep -v "^F16 \["
python3 tools/cuda/trace.py $R/8b/trace-F16.txt --positions 200 | tail -6
rm -f $R/8b/trace-F16.txt
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
