//! The kernel source compiles, and names a kernel for every kind the launch
//! table lists. Needs only libnvrtc (CI installs PyPI's `nvidia-cuda-nvrtc`);
//! without it the compile test says loudly what it did not check.

use ferrox_quant::QuantKind;

#[test]
fn every_kernel_compiles_for_sm_90_with_nvrtc() {
    if !ferrox_cuda::nvrtc_present() {
        eprintln!("NOT CHECKED: libnvrtc is not loadable here, so the CUDA kernels were not compiled (install nvidia-cuda-nvrtc and put its lib/ on LD_LIBRARY_PATH)");
        return;
    }
    match ferrox_cuda::compile_check(ferrox_cuda::CHECK_ARCH) {
        Ok(bytes) => assert!(bytes > 10_000, "suspiciously small PTX: {bytes} bytes"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn every_kind_in_the_launch_table_has_its_three_kernels_in_the_source() {
    let src = ferrox_cuda::kernel_source();
    let mut n = 0;
    for &k in QuantKind::ALL {
        if let Some(s) = ferrox_cuda::kernel_suffix(k) {
            let line = format!("DEFINE_KIND({s})");
            assert!(
                src.lines().any(|l| l.trim() == line),
                "{k}: no {line} line in kernels.cu"
            );
            assert!(
                src.contains(&format!("deq_{s}(")),
                "{k}: no deq_{s} in kernels.cu"
            );
            // The int8-activation kinds also need their decode matvec and
            // the gate/up matvec with the GLU (Device::open loads both).
            if ferrox_cuda::mmvq_kind(k) {
                for def in [format!("DEFINE_MMVQ_STREAM({s})"), format!("DEFINE_MMVQ_GLU({s})")] {
                    assert!(
                        src.lines().any(|l| l.trim() == def),
                        "{k}: no {def} line in kernels.cu"
                    );
                }
            }
            n += 1;
        }
    }
    assert!(n >= 7, "the launch table shrank to {n} kinds");
}
