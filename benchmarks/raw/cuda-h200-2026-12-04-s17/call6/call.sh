# session 17 call 6: the output norm fused into the head's matvec (the model's head through
# norm_matmul_many: one matvec_f16_norm_stream launch for an F16 head, no add_rms_norm before it).
# GPU tests (every architecture and greedy decode GPU vs CPU run the new wiring), then 1b F16 decode
# A/B against main (BASE=1, three rounds) and the trace.
D=target/h-cuda28
R=$OUT
export FERROX_REQUIRE_GPU=1 FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache
mkdir -p $R/tests
timeout 150 $D/tests/ferrox_core backend:: --test-threads=1 --nocapture >$R/tests/tests.log 2>&1
echo "tests rc=$?: $(grep -E '^test result' $R/tests/tests.log | tail -1)"; grep -E "NOT CHECKED|panicked|FAILED" $R/tests/tests.log | head -6
OUT=$R/1b D=$D SKIP_TESTS=1 KINDS="F16" ROUNDS=3 VARIANTS=";BASE=1" TRACE_KINDS="F16" bash scripts/cuda-dev.sh 2>&1 | grep -v "^F16 \["
python3 tools/cuda/trace.py $R/1b/trace-F16.txt --positions 200 | tail -3
rm -f $R/1b/trace-F16.txt
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
