# session 17 call 5: main's build (a38e42d), the F16 streaming matvecs' compile-time step knobs and
# the L2::256B weight load, tg128 8b F16 (one round) and 1b F16 (two rounds).
D=target/h-cuda27
R=$OUT
export FERROX_REQUIRE_GPU=1 FERROX_CUDA_CACHE=/tmp/ferrox-cuda-cache
cp $D/ferrox-base $D/ferrox
X=FERROX_CUDA_DEFINES
V=";$X=F16S_STEP=6;$X=F16S_STEP=12;$X=F16S_GSTEP=3;$X=F16S_GSTEP=6;$X=FERROX_WLOAD=1"
OUT=$R/8b D=$D SKIP_TESTS=1 SHAPE=llama-8b KINDS="F16" ROUNDS=1 VARIANTS="$V" bash scripts/cuda-dev.sh 2>&1 | grep median
OUT=$R/1b D=$D SKIP_TESTS=1 KINDS="F16" ROUNDS=2 VARIANTS="$V" bash scripts/cuda-dev.sh 2>&1 | grep median
cd $R && tar czf ../all.tgz . && rm -rf ./* && mv ../all.tgz .
