# session 15 call 5: read-backs through a page-locked buffer (FERROX_CUDA_READ 0/1/2) + argmax over
# many blocks (branch h/cuda17-argmax); then the side by side with llama.cpp
D=target/h-cuda22
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
echo "sabotaged (argmax counter never reset; read pieces past the second never copied):"
timeout 100 $D/tests-sabotaged/ferrox_core backend::cuda::tests::argmax backend::cuda::tests::read_back --test-threads=1 2>&1 | grep -E "^test |^test result" | head -4
OUT=$R/dev D=$D KINDS="F16 Q4_0" ROUNDS=2 VARIANTS=";FERROX_CUDA_READ=1;FERROX_CUDA_READ=0;BASE=1" TEST_VARIANTS="FERROX_CUDA_READ=0;FERROX_CUDA_READ=1" bash scripts/cuda-dev.sh 2>&1 | grep -v "^F16 \[\|^Q4_0 \["
grep -q "test result: ok" $R/dev/tests.log || { echo "tests failed: stop"; kill $LLPID; exit 1; }
wait $LLPID
echo "llama built: $(ls $LL/.built)"
OUT=$R/sbs1 LOG=$R/sbs1 D=$D SKIP_TESTS=1 SKIP_KB=1 KINDS="Q4_K_M Q8_0 Q4_0" REPS=3 bash scripts/cuda-side-by-side.sh 2>&1 | tail -9
OUT=$R/sbs8 LOG=$R/sbs8 D=$D SKIP_TESTS=1 SKIP_KB=1 SHAPE=llama-8b KINDS="Q8_0" RUN_CHECK=0 REPS=3 bash scripts/cuda-side-by-side.sh 2>&1 | tail -6
rm -f $R/sbs1/logs.tgz $R/sbs8/logs.tgz
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
