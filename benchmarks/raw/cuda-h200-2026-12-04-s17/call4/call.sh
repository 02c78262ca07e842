# session 17 call 4: h/cuda19-attn — the decode attention issues its loads of the keys and values
# earlier passes stored before PDL_ENTER (FERROX_DEC_EARLY, 0 = all after), and the RoPE epilogue
# for partial rotation (the pair slot alternating with the barriers taken). GPU tests, two
# sabotaged builds (sab1: the keys before the wait never loaded; sab2: those after it never
# loaded), decode A/B against main (BASE=1), 1b at depths 0 and 4096 (split attention), 8b F16.
D=target/h-cuda27
R=$OUT
export FERROX_REQUIRE_GPU=1 FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache
mkdir -p $R/tests
timeout 150 $D/tests/ferrox_core backend:: --test-threads=1 --nocapture >$R/tests/tests.log 2>&1
echo "tests rc=$?: $(grep -E '^test result' $R/tests/tests.log | tail -1)"; grep -E "NOT CHECKED|panicked|FAILED" $R/tests/tests.log | head -6
A="backend::cuda::tests::attention backend::cuda::tests::fused_rope backend::cuda::tests::qkv_rope backend::cuda::tests::greedy"
for s in sab1 sab2; do
  echo "$s:"; timeout 120 $D/$s/ferrox_core $A --test-threads=1 2>&1 | grep -E "^test |^test result" | head -6
done
FERROX_CUDA_DEFINES=FERROX_DEC_EARLY=0 timeout 120 $D/tests/ferrox_core $A --test-threads=1 >$R/tests/early0.log 2>&1
echo "DEC_EARLY=0 tests rc=$?: $(grep -E '^test result' $R/tests/early0.log | tail -1)"
V=";FERROX_CUDA_DEFINES=FERROX_DEC_EARLY=0;BASE=1"
OUT=$R/1b D=$D SKIP_TESTS=1 KINDS="F16 Q4_0 Q8_0" ROUNDS=2 VARIANTS="$V" bash scripts/cuda-dev.sh 2>&1 | grep median
OUT=$R/1bd D=$D SKIP_TESTS=1 KINDS="F16" DEPTH="4096" ROUNDS=1 VARIANTS="$V" bash scripts/cuda-dev.sh 2>&1 | grep median
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=2 VARIANTS="$V" bash scripts/cuda-dev.sh 2>&1 | grep median
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
