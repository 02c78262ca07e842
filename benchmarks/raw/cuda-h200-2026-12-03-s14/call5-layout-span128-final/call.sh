D=target/h-cuda18
R=$OUT
LL=/tmp/llama; mkdir -p $LL $R/logs
if [ ! -f $LL/.built ]; then
( mkdir -p $LL/src && tar xzf $D/llama-src.tgz -C $LL/src && cd $LL/src && \
    cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
      -DCMAKE_BUILD_TYPE=Release >$R/logs/llama-cmake.log 2>&1 && \
    nice cmake --build build --target llama-bench llama-quantize -j14 >$R/logs/llama-build.log 2>&1 && \
    mkdir -p $LL/bin && cp build/bin/llama-bench build/bin/llama-quantize $LL/bin/ && strip $LL/bin/* && touch $LL/.built ) &
LLPID=$!
fi
OUT=$R/dev D=$D SABOTAGE=1 TEST_VARIANTS="FERROX_CUDA_DEC_SPLIT_HEADS=1;FERROX_CUDA_DEC_HEADS=0" KINDS="F16 Q4_0" DEPTH="0,1024,4096" ROUNDS=2 \
  VARIANTS=";BASE=1;FERROX_CUDA_DEC_SPAN=256" bash scripts/cuda-dev.sh 2>&1 | grep -v "^F16 \[\|^Q4_0 \["
grep -q "test result: ok" $R/dev/tests.log || { echo "tests failed: stop"; kill $LLPID; exit 1; }
[ -n "${LLPID:-}" ] && wait $LLPID
echo "llama built: $(ls $LL/.built)"
OUT=$R/sbs1 LOG=$R/sbs1 D=$D SKIP_TESTS=1 SKIP_KB=1 KINDS="Q4_0" DEPTH="0,1024,4096" REPS=3 bash scripts/cuda-side-by-side.sh 2>&1 | tail -7
OUT=$R/sbs8 LOG=$R/sbs8 D=$D SKIP_TESTS=1 SKIP_KB=1 SHAPE=llama-8b KINDS=" " RUN_CHECK=0 DEPTH="0,4096" REPS=3 bash scripts/cuda-side-by-side.sh 2>&1 | tail -5
rm -f $R/sbs1/logs.tgz $R/sbs8/logs.tgz
