//! The Metal backend end to end on the real Gemma 3 270M: `ferrox run
//! --backend metal` gives text, and its logits follow the CPU's
//! (`common::device_follows_the_cpu`).
//!
//! Where it runs: a `metal` build whose Metal device opens. Off Apple
//! targets that is the shim (the Metal kernels compiled as C++, run on the
//! CPU), opened by `FERROX_METAL=shim`; CI sets it with
//! `FERROX_REQUIRE_METAL=1`, so a device that does not open fails there.
//! On a Mac it is the GPU — which this project has never run it on.
//! Anywhere else the test says loudly what it did not check.

mod common;
use common::*;

#[test]
fn metal_on_gemma_follows_the_cpu() {
    device_follows_the_cpu("metal", "Metal", cfg!(feature = "metal"));
}
