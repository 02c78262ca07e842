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
fn every_kind_in_the_launch_table_has_its_kernels_in_the_source() {
    let src = ferrox_cuda::kernel_source();
    let defined = ferrox_cuda::defined_kernels(src);
    let mut n = 0;
    for &k in QuantKind::ALL {
        if let Some(names) = ferrox_ops::cuda::kind_kernels(k) {
            let s = ferrox_cuda::kernel_suffix(k).unwrap();
            assert!(src.contains(&format!("deq_{s}(")), "{k}: no deq_{s} in kernels.cu");
            let int8 = names.int8.iter().flat_map(|(a, b)| [a, b]);
            let mma = names.mma.iter().flatten();
            let experts = names.experts_int8.iter().flat_map(|(a, b)| std::iter::once(a).chain(b));
            let base = [&names.matvec, &names.get_rows, &names.dequant_f16, &names.matvec_id];
            for name in base.into_iter().chain(int8).chain(mma).chain(experts) {
                assert!(defined.contains(name), "{k}: kernels.cu defines no {name}");
            }
            n += 1;
        }
    }
    assert!(n >= 7, "the launch table shrank to {n} kinds");
}

/// The parser behind the claims⇔launch test sees through the macros: a
/// `DEFINE_KIND(x)` line defines every `name_##NAME` of the macro's body
/// for `x`, and a plain kernel is found by its name.
#[test]
fn defined_kernels_expands_the_kind_macros() {
    let src = "#define DEFINE_KIND(NAME) \\\n    extern \"C\" __global__ void matvec_##NAME(int a) { \\\n    } \\\n    extern \"C\" __global__ void __launch_bounds__(256, B) get_rows_##NAME(int a) {}\nDEFINE_KIND(q9_0)\nextern \"C\" __global__ void rms_norm(float* x) {}\n";
    let d = ferrox_cuda::defined_kernels(src);
    let want: std::collections::BTreeSet<String> =
        ["matvec_q9_0", "get_rows_q9_0", "rms_norm"].iter().map(|s| s.to_string()).collect();
    assert_eq!(d, want);
    // Several parameters, pasted inside the name.
    let src = "#define DEFINE_TILE(NAME, NT) \\\n    extern \"C\" __global__ void tile_##NAME##_n##NT(int a) {}\nDEFINE_TILE(q9_0, 4)\n";
    let d = ferrox_cuda::defined_kernels(src);
    assert_eq!(d.into_iter().collect::<Vec<_>>(), ["tile_q9_0_n4"]);
}

/// Each kernel's parameter types as a launch must pass them, read through
/// the macros and the launch bounds.
#[test]
fn kernel_signatures_read_each_parameter_type() {
    let sigs = ferrox_cuda::kernel_signatures(ferrox_cuda::kernel_source());
    let sig = |k: &str| sigs.get(k).unwrap_or_else(|| panic!("no {k}")).join(", ");
    assert_eq!(sig("rms_norm"), "ptr, ptr, int, float");
    assert_eq!(sig("matvec_q4_k"), "ptr, ptr, ptr, int, int, long long");
    assert_eq!(sig("matvec_f16_stream"), "MmvqMats, ptr, int");
    assert!(sig("mmvq_stream_q8_0").starts_with("MmvqMats"), "{}", sig("mmvq_stream_q8_0"));
    assert_eq!(sigs.len(), ferrox_cuda::defined_kernels(ferrox_cuda::kernel_source()).len());
    assert!(sigs.len() > 100, "{} kernels", sigs.len());
}

