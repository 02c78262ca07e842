cd target/probe
nvcc -O3 -arch=sm_90a -std=c++17 rd.cu -o rd 2>&1 | grep -v Warn | head -20
./rd
python3 mv.py
cd ../..
for sh in 14336x4096 4096x14336 4096x4096 8192x2048 2048x8192; do KB_KINDS=F16 KB_GEMM=0 target/h-cuda20/kernel_bench ${sh%x*} ${sh#*x} 2>&1 | grep -v "^kind\|^device"; done
