//! The Vulkan backend end to end on the real Gemma 3 270M: `ferrox run
//! --backend vulkan` gives text, and its logits follow the CPU's
//! (`common::device_follows_the_cpu`).
//!
//! Where it runs: a `vulkan` build on a machine with a Vulkan device. CI has
//! Mesa's lavapipe and names it (`FERROX_VULKAN_DEVICE=llvmpipe`; a CPU
//! device is used only when named) and sets `FERROX_REQUIRE_VULKAN=1`, so a
//! device that does not open fails there; anywhere else the test says
//! loudly what it did not check.

mod common;
use common::*;

#[test]
fn vulkan_on_gemma_follows_the_cpu() {
    device_follows_the_cpu("vulkan", "Vulkan", cfg!(feature = "vulkan"));
}
