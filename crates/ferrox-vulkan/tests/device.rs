//! The device's own mechanics on a real Vulkan device: a decode step
//! recorded once and replayed, and the pipeline cache kept on disk (a
//! damaged file ignored, never a crash). CI names lavapipe
//! (`FERROX_VULKAN_DEVICE=llvmpipe`) and sets `FERROX_REQUIRE_VULKAN=1`, so a
//! device that does not open fails there; elsewhere the tests say what they
//! did not check.

use ferrox_vulkan::{Device, Options, Push};

fn open(opts: &Options, what: &str) -> Option<Device> {
    match Device::open_with(0, opts) {
        Ok(d) => Some(d),
        Err(e) => {
            let required = std::env::var_os("FERROX_REQUIRE_VULKAN").is_some_and(|v| v == "1");
            assert!(!required, "FERROX_REQUIRE_VULKAN=1 and no Vulkan device opened: {e}");
            eprintln!("NOT CHECKED: {what} (no Vulkan device: {e})");
            None
        }
    }
}

fn floats(d: &Device, b: &ferrox_vulkan::Buf, n: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; n * 4];
    d.read(b, 0, &mut bytes).unwrap();
    bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `dst += a` over `n` floats (`unary.comp`'s op 1).
fn add(d: &Device, dst: &ferrox_vulkan::Buf, a: &ferrox_vulkan::Buf, n: usize) {
    let push = Push::default().ptr(dst.addr(0)).ptr(a.addr(0)).u32(n as u32).u32(1).u32(1).f32(0.0);
    d.launch("unary", &push, n.div_ceil(64), 1).unwrap();
}

/// A scratch folder of this test's own.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrox-vulkan-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_recorded_step_runs_only_when_replayed_and_reads_the_buffers_as_they_are_then() {
    let Some(d) = open(&Options { cache_dir: None, staged: None, int_dot: true }, "record and replay") else { return };
    let n = 300;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
    let (ab, acc) = (d.upload(&bytes(&a)).unwrap(), d.alloc(n * 4).unwrap());
    d.begin_capture().unwrap();
    add(&d, &acc, &ab, n);
    add(&d, &acc, &ab, n);
    assert!(d.read(&acc, 0, &mut [0u8; 4]).is_err(), "a host read inside a recording must be refused");
    assert!(d.begin_capture().is_err(), "a second recording inside one must be refused");
    let r = d.end_capture().unwrap();
    assert!(floats(&d, &acc, n).iter().all(|&v| v == 0.0), "recording ran launches");
    d.replay(&r).unwrap();
    d.replay(&r).unwrap();
    let want: Vec<f32> = a.iter().map(|&x| 4.0 * x).collect();
    assert_eq!(floats(&d, &acc, n), want, "two replays of two adds");
    // The step's input changes between replays, as a decode step's token does.
    let a2: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    d.write(&ab, 0, &bytes(&a2)).unwrap();
    d.replay(&r).unwrap();
    let want: Vec<f32> = a.iter().zip(&a2).map(|(&x, &y)| 4.0 * x + 2.0 * y).collect();
    assert_eq!(floats(&d, &acc, n), want, "a replay after the input changed");
    assert!(d.end_capture().is_err(), "no recording is open");
}

#[test]
fn the_pipeline_cache_is_kept_on_disk_and_a_damaged_one_is_ignored() {
    let dir = scratch("pipeline-cache");
    let opts = Options { cache_dir: Some(dir.clone()), staged: None, int_dot: true };
    let run = |what: &str| -> Option<bool> {
        let d = open(&opts, what)?;
        let n = 70;
        let (a, acc) = (d.upload(&bytes(&vec![1.5; n])).unwrap(), d.alloc(n * 4).unwrap());
        add(&d, &acc, &a, n);
        assert_eq!(floats(&d, &acc, n), vec![1.5; n], "{what}: the product after the cache");
        Some(d.pipeline_cache_loaded())
    };
    let Some(first) = run("the pipeline cache on disk") else { return };
    assert!(!first, "an empty folder has no cache to load");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "one cache file: {files:?}");
    let file = files[0].clone();
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("pipelines-") && name.ends_with(".bin") && name.len() == "pipelines-.bin".len() + 32, "{name}");
    assert_eq!(run("a stored cache"), Some(true), "the stored cache was not loaded");
    let good = std::fs::read(&file).unwrap();
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x5a;
    let damaged: [(&str, Vec<u8>); 4] = [
        ("a flipped byte", flipped),
        ("a truncated file", good[..good.len() / 2].to_vec()),
        ("five bytes", good[..5].to_vec()),
        ("another program's file", b"\x7fELF not a cache at all".to_vec()),
    ];
    for (what, bytes) in damaged {
        std::fs::write(&file, bytes).unwrap();
        assert_eq!(run(what), Some(false), "{what}: a damaged cache was taken");
        assert_eq!(run(what), Some(true), "{what}: the cache was not written again whole");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The device-local path a discrete GPU takes (buffers reached through the
/// staging buffer), forced on whatever device this is, beside the mapped one:
/// zeroed allocations, uploads, writes and reads at offsets, a launch between,
/// a read-back larger than the staging buffer's first size, and a replay whose
/// input is written through the staging buffer.
#[test]
fn device_local_buffers_through_the_staging_buffer_hold_what_mapped_ones_do() {
    for staged in [true, false] {
        let Some(d) = open(&Options { cache_dir: None, staged: Some(staged), int_dot: true }, "device-local buffers") else { return };
        assert_eq!(d.staged(), staged);
        let n = (3 << 20) / 4 + 5; // past the first 1 MiB staging buffer
        let zero = d.alloc(n * 4).unwrap();
        assert!(floats(&d, &zero, n).iter().all(|&v| v == 0.0), "staged {staged}: a fresh buffer is not zeroed");
        let a: Vec<f32> = (0..n).map(|i| (i % 1013) as f32 - 500.0).collect();
        let ab = d.upload(&bytes(&a)).unwrap();
        assert_eq!(floats(&d, &ab, n), a, "staged {staged}: upload then read");
        add(&d, &zero, &ab, n);
        add(&d, &zero, &ab, n);
        let mut part = vec![0u8; 40];
        d.read(&zero, 4 * 1000, &mut part).unwrap();
        let want: Vec<f32> = a[1000..1010].iter().map(|&x| 2.0 * x).collect();
        assert_eq!(part, bytes(&want), "staged {staged}: a read at an offset after two launches");
        d.write(&ab, 4 * 7, &bytes(&[1e6, -1e6])).unwrap();
        let got = floats(&d, &ab, 10);
        assert_eq!(&got[6..10], &[a[6], 1e6, -1e6, a[9]], "staged {staged}: a write at an offset");
        let (x, acc) = (d.upload(&bytes(&[1.0; 64])).unwrap(), d.alloc(64 * 4).unwrap());
        d.begin_capture().unwrap();
        add(&d, &acc, &x, 64);
        assert!(d.write(&x, 0, &[0; 4]).is_err(), "staged {staged}: a write inside a recording must be refused");
        let r = d.end_capture().unwrap();
        d.replay(&r).unwrap();
        d.write(&x, 0, &bytes(&[3.0; 64])).unwrap();
        d.replay(&r).unwrap();
        assert_eq!(floats(&d, &acc, 64), vec![4.0; 64], "staged {staged}: replays around a write");
    }
}
