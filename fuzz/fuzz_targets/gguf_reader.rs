//! Fuzzes the GGUF reader: any bytes parse or give an error, never a panic
//! or an allocation out of proportion to the input (run with
//! `-malloc_limit_mb`, see the README). Whatever parses is walked fully, and
//! written back: the rewrite must parse, and rewriting it again must give
//! the same bytes (the writer's layout is a fixed point).
#![no_main]

use ferrox_gguf::{GgufFile, GgufModel, GgufWriter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data) else {
        return;
    };
    for (k, _) in f.metadata() {
        let _ = (f.get_str(k), f.get_uint(k), f.get_array(k), f.get_f32(k));
    }
    for t in f.tensors() {
        let bytes = f
            .tensor_data(t)
            .expect("a tensor of a parsed file is in bounds");
        assert_eq!(bytes.len() as u64, t.n_bytes);
    }
    // Padding to a huge alignment is legal but would make the rewrite huge.
    if f.alignment() > 1 << 16 {
        return;
    }
    let once = GgufWriter::from_file(&f)
        .expect("a parsed file can be rewritten")
        .to_bytes();
    let g = GgufFile::from_bytes(&once).expect("a rewritten file parses");
    assert_eq!(g.metadata().len(), f.metadata().len());
    assert_eq!(g.tensors().len(), f.tensors().len());
    let twice = GgufWriter::from_file(&g).expect("rewritable").to_bytes();
    assert!(once == twice, "rewriting is not a fixed point");
    let _ = GgufModel::from_parts(vec![g]);
});
