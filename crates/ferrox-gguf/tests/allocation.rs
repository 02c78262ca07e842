//! Hostile counts cost no memory: parsing allocates in proportion to the
//! input, whatever counts and lengths the input claims. Measured with a
//! counting allocator; this binary holds one test so nothing else allocates
//! concurrently.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::Raw;
use ferrox_gguf::GgufFile;

struct Counting;

static TOTAL: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to `System` unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        TOTAL.fetch_add(layout.size(), Ordering::Relaxed);
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which is System's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout (via `alloc` above).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Bytes allocated while parsing `input` (the copy into owned storage included).
fn allocated_by_parse(input: &[u8]) -> (usize, usize) {
    TOTAL.store(0, Ordering::Relaxed);
    LARGEST.store(0, Ordering::Relaxed);
    let r = GgufFile::from_bytes(input);
    let out = (
        TOTAL.load(Ordering::Relaxed),
        LARGEST.load(Ordering::Relaxed),
    );
    drop(r);
    out
}

#[test]
fn parsing_allocates_in_proportion_to_the_input_not_to_claimed_counts() {
    let huge = 1u64 << 60;
    let mut nested_claims = Raw::header(3, 0, 1).str(b"k").u32(9);
    // Each level claims as many sub-arrays as the rest of the file could hold.
    for _ in 0..15 {
        nested_claims = nested_claims.u32(9).u64(1000);
    }
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("tensor count 2^60", Raw::header(3, huge, 0).zeros(100).0),
        ("kv count 2^60", Raw::header(3, 0, huge).zeros(100).0),
        (
            "key length 2^60",
            Raw::header(3, 0, 1).u64(huge).zeros(100).0,
        ),
        (
            "string length 2^60",
            Raw::header(3, 0, 1).str(b"k").u32(8).u64(huge).zeros(100).0,
        ),
        (
            "u8 array of 2^60",
            Raw::header(3, 0, 1)
                .str(b"k")
                .u32(9)
                .u32(0)
                .u64(huge)
                .zeros(100)
                .0,
        ),
        (
            "array of 2^60 arrays",
            Raw::header(3, 0, 1)
                .str(b"k")
                .u32(9)
                .u32(9)
                .u64(huge)
                .zeros(100)
                .0,
        ),
        // Plausible claims: a count the remaining bytes could just hold.
        (
            "string array filling the file",
            Raw::header(3, 0, 1)
                .str(b"k")
                .u32(9)
                .u32(8)
                .u64(12_500)
                .zeros(100_000)
                .0,
        ),
        (
            "nested arrays, 1000 per level",
            nested_claims.zeros(12_000).0,
        ),
        (
            "tensor count filling the file",
            Raw::header(3, 4000, 0).zeros(96_000).0,
        ),
    ];
    for (what, input) in &inputs {
        let (total, largest) = allocated_by_parse(input);
        let budget = 64 * 1024 + 8 * input.len();
        assert!(
            total <= budget,
            "{what}: allocated {total} bytes for a {}-byte input (budget {budget})",
            input.len()
        );
        assert!(
            largest <= budget,
            "{what}: one allocation of {largest} bytes"
        );
    }
}
