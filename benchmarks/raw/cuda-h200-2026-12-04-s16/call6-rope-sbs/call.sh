# session 16 call 6: RoPE and the cache store in the QKV matvec's epilogue (FERROX_CUDA_QKV_ROPE=0
# turns it off) on top of the fused norm / residual matvecs; tests, both sabotaged builds, decode
# A/B (1b F16/Q8_0/Q4_0, 8b F16) against main (BASE=1), then the side by side with llama.cpp.
# If the tests fail, the side by side runs the build without the epilogue (call 3's, ferrox-s24).
D=target/h-cuda25
R=$OUT
LL=/tmp/llama; mkdir -p $LL $R/logs
( mkdir -p $LL/src && tar xzf $D/llama-src.tgz -C $LL/src && cd $LL/src && \
    cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
      -DCMAKE_BUILD_TYPE=Release >$R/logs/llama-cmake.log 2>&1 && \
    nice cmake --build build --target llama-bench llama-quantize -j14 >$R/logs/llama-build.log 2>&1 && \
    mkdir -p $LL/bin && cp build/bin/llama-bench build/bin/llama-quantize $LL/bin/ && strip $LL/bin/* && touch $LL/.built ) &
LLPID=$!
export FERROX_REQUIRE_GPU=1
echo "sabotaged 1 (norm scale dropped; acc ignored):"
timeout 100 $D/tests-sabotaged/ferrox_core backend::cuda::tests::fused_norm --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" | head -3
echo "sabotaged 2 (RoPE sign of even rows):"
timeout 100 $D/tests-sabotaged2/ferrox_core backend::cuda::tests::qkv_rope --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" | head -3
OUT=$R/dev D=$D KINDS="F16 Q8_0 Q4_0" ROUNDS=2 VARIANTS=";FERROX_CUDA_QKV_ROPE=0;BASE=1" TEST_VARIANTS="FERROX_CUDA_QKV_ROPE=0;FERROX_CUDA_NORM_FUSE=0" TRACE_KINDS="F16" bash scripts/cuda-dev.sh 2>&1 | grep -v "^F16 \[\|^Q8_0 \[\|^Q4_0 \["
if ! grep -q "test result: ok" $R/dev/tests.log; then echo "TESTS FAILED: side by side with ferrox-s24"; cp $D/ferrox-s24 $D/ferrox; fi
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=1 VARIANTS=";FERROX_CUDA_QKV_ROPE=0;BASE=1" bash scripts/cuda-dev.sh 2>&1 | grep median
rm -f $R/dev/trace-F16.txt
wait $LLPID
echo "llama built: $(ls $LL/.built)"
OUT=$R/sbs1 LOG=$R/sbs1 D=$D SKIP_TESTS=1 SKIP_KB=1 KINDS="Q4_K_M Q8_0 Q4_0" REPS=3 bash scripts/cuda-side-by-side.sh 2>&1 | tail -9
OUT=$R/sbs8 LOG=$R/sbs8 D=$D SKIP_TESTS=1 SKIP_KB=1 SHAPE=llama-8b KINDS="Q8_0" RUN_CHECK=0 REPS=3 bash scripts/cuda-side-by-side.sh 2>&1 | tail -6
rm -f $R/sbs1/logs.tgz $R/sbs8/logs.tgz
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
