# session 18 call 1: tools/cuda/boundary_bench.cu built there (nvcc 13.0), 32 layers (Llama-8b F16's
# decode matvecs and head, 15.0 GB a step) and 16 layers, 20 timed replays after 3, two rounds.
# (This first run had no `nobar` variant; call 2 added it.)
mkdir -p $OUT; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; (nvcc -O3 -arch=sm_90 -o /tmp/bbd tools/cuda/boundary_bench.cu && echo built-there) 2>&1 | tail -3; B=/tmp/bbd; [ -x $B ] || B=target/bb/bb; echo using $B; $B 32 20 2>&1 | tee $OUT/bb32.txt; $B 16 20 2>&1 | tee $OUT/bb16.txt
