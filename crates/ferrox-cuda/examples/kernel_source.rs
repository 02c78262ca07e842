//! Prints the CUDA source NVRTC compiles (the IQ tables printed from
//! ferrox-quant, then `kernels.cu`), for `tools/cuda/regs.py`.

fn main() {
    print!("{}", ferrox_cuda::kernel_source());
}
