//! Every expected id here comes from llama.cpp (its shipped `.inp/.out`
//! vocab tests, or `tools/reftok/gen.py` running `llama-tokenize`) or is
//! worked out by hand from the algorithm on a tiny vocabulary.

use std::path::{Path, PathBuf};

use ferrox_gguf::{Array, GgufFile, GgufString, GgufWriter, Value};

use super::{attr, Detokenizer, Tokenizer, TokenizerError};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tokenizer").join(name)
}

/// llama.cpp's `models/` folder, for the vocabularies too big to commit.
fn llama_models_dir() -> PathBuf {
    std::env::var_os("FERROX_LLAMA_CPP")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/ferrox/ref/llama_cpp_python-0.3.36/vendor/llama.cpp"))
        .join("models")
}

/// Reads llama.cpp's `test-tokenizer-0` pairs: inputs separated by
/// `\n__ggml_vocab_test__\n`, one line of ids per input.
fn vocab_cases(gguf: &Path) -> Vec<(Vec<u8>, Vec<u32>)> {
    let inp = std::fs::read(gguf.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).unwrap();
    let sep = b"\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match super::find(&inp[pos..], sep) {
            Some(at) => {
                texts.push(inp[pos..pos + at].to_vec());
                pos += at + sep.len();
            }
            None => {
                texts.push(inp[pos..].to_vec());
                break;
            }
        }
    }
    let ids: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert_eq!(texts.len(), ids.len(), "{}: inputs and outputs disagree in count", gguf.display());
    texts.into_iter().zip(ids).collect()
}

fn check_vocab(gguf: &Path) -> usize {
    let file = GgufFile::open(gguf).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let cases = vocab_cases(gguf);
    let mut bad = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode(text, false, false).unwrap();
        if &got != want {
            bad.push(format!("{:?}\n   want {want:?}\n    got {got:?}", String::from_utf8_lossy(text)));
        }
    }
    assert!(bad.is_empty(), "{}: {} of {} differ from llama.cpp:\n{}", gguf.display(), bad.len(), cases.len(), bad.join("\n"));
    cases.len()
}

#[test]
fn llama_spm_vocab_matches_llama_cpp_test_ids() {
    assert!(check_vocab(&testdata("ggml-vocab-llama-spm.gguf")) > 40);
}

#[test]
fn gpt2_vocab_matches_llama_cpp_test_ids() {
    assert!(check_vocab(&testdata("ggml-vocab-gpt-2.gguf")) > 40);
}

/// The larger vocabularies are read from llama.cpp's tree when it is there.
fn check_external_vocab(name: &str) {
    let path = llama_models_dir().join(name);
    if !path.exists() {
        eprintln!("SKIPPED: {} not found (set FERROX_LLAMA_CPP); its pre-tokenizer was NOT checked", path.display());
        return;
    }
    assert!(check_vocab(&path) > 40);
}

#[test]
fn llama3_bpe_vocab_matches_llama_cpp_test_ids() {
    check_external_vocab("ggml-vocab-llama-bpe.gguf");
}

#[test]
fn qwen2_vocab_matches_llama_cpp_test_ids() {
    check_external_vocab("ggml-vocab-qwen2.gguf");
}

#[test]
fn starcoder_family_is_refused_not_mis_tokenized() {
    let path = llama_models_dir().join("ggml-vocab-starcoder.gguf");
    if !path.exists() {
        eprintln!("SKIPPED: {} not found", path.display());
        return;
    }
    let file = GgufFile::open(&path).unwrap();
    assert!(matches!(Tokenizer::from_gguf(&file), Err(TokenizerError::UnsupportedPreTokenizer(p)) if p == "starcoder"));
}

fn home() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
}

/// The real model: `$FERROX_TEST_MODEL`, else where `scripts/get-model.sh` puts it.
fn gemma() -> String {
    std::env::var("FERROX_TEST_MODEL").unwrap_or_else(|_| {
        home().join(".cache/ferrox/models/gemma-3-270m-q4_k_m.gguf").display().to_string()
    })
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// Compares with `tools/reftok/gen.py`'s record of `llama-tokenize` output.
fn check_jsonl(model: &Path, jsonl: &str) {
    let file = GgufFile::open(model).unwrap();
    check_jsonl_with(&Tokenizer::from_gguf(&file).unwrap(), jsonl);
}

fn check_jsonl_with(tok: &Tokenizer, jsonl: &str) {
    let lines = std::fs::read_to_string(testdata(jsonl)).unwrap();
    let mut n = 0;
    let mut bad = Vec::new();
    for line in lines.lines() {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let text = hex(case["text_hex"].as_str().unwrap());
        let want: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let got = tok
            .encode(&text, case["add_special"].as_bool().unwrap(), case["parse_special"].as_bool().unwrap())
            .unwrap();
        if got != want {
            bad.push(format!("{}: want {want:?}\n    got {got:?}", case["name"]));
        }
        n += 1;
    }
    assert!(n >= 50, "{jsonl}: only {n} reference cases");
    assert!(bad.is_empty(), "{jsonl}: {} of {n} cases differ from llama.cpp:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn gemma3_ids_match_llama_tokenize() {
    let model = gemma();
    if !Path::new(&model).exists() {
        eprintln!("SKIPPED: {model} not found (set FERROX_TEST_MODEL); Gemma 3 ids were NOT checked against llama.cpp");
        return;
    }
    check_jsonl(Path::new(&model), "gemma3.jsonl");
}

#[test]
fn gemma3_decode_streams_the_text_back_and_end_of_turn_ends_generation() {
    let model = gemma();
    if !Path::new(&model).exists() {
        eprintln!("SKIPPED: {model} not found; Gemma 3 decoding was NOT checked");
        return;
    }
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model).unwrap()).unwrap();
    let text = "Grüße 🦙🚀 日本語\n\tcode  x";
    let ids = tok.encode(text.as_bytes(), false, false).unwrap();
    let mut d = Detokenizer::new(&tok, false);
    let mut streamed = String::new();
    for &id in &ids {
        let part = d.push(id).unwrap();
        assert!(!part.contains('\u{FFFD}'), "token {id} produced a broken character");
        streamed.push_str(&part);
    }
    streamed.push_str(&d.finish());
    assert_eq!(streamed, text);
    // llama.cpp lists <eos> (1) and <end_of_turn> (106) as Gemma 3's EOG tokens.
    assert_eq!((tok.bos(), tok.eos(), tok.eot()), (Some(2), Some(1), Some(106)));
    assert!(tok.is_eog(1) && tok.is_eog(106) && !tok.is_eog(105) && !tok.is_eog(2));
}

#[test]
fn gpt2_ids_for_hard_strings_match_llama_tokenize() {
    check_jsonl(&testdata("ggml-vocab-gpt-2.gguf"), "gpt-2.jsonl");
}

fn check_external_jsonl(vocab: &str, jsonl: &str) {
    let path = llama_models_dir().join(vocab);
    if !path.exists() {
        eprintln!("SKIPPED: {} not found (set FERROX_LLAMA_CPP); {jsonl} was NOT checked", path.display());
        return;
    }
    check_jsonl(&path, jsonl);
}

#[test]
fn llama3_ids_for_hard_strings_match_llama_tokenize() {
    check_external_jsonl("ggml-vocab-llama-bpe.gguf", "llama-bpe.jsonl");
}

#[test]
fn qwen2_ids_for_hard_strings_match_llama_tokenize() {
    check_external_jsonl("ggml-vocab-qwen2.gguf", "qwen2.jsonl");
}

/// `path`'s metadata with `tokenizer.ggml.pre` set to `pre`, as
/// `tools/reftok/gen.py --pre` writes it for `llama-tokenize`.
fn retagged(path: &Path, pre: &str) -> Tokenizer {
    let file = GgufFile::open(path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        if k != "tokenizer.ggml.pre" {
            w.set(k.clone(), v.clone()).unwrap();
        }
    }
    w.set("tokenizer.ggml.pre", pre).unwrap();
    Tokenizer::from_gguf(&GgufFile::from_bytes(&w.to_bytes()).unwrap()).unwrap()
}

/// No o200k vocabulary ships with llama.cpp, so the `gpt-4o` split is
/// checked through two that do, retagged: GPT-2's (committed) and Llama 3's
/// (cl100k-derived, multilingual; from llama.cpp's tree when there). The
/// split decides where merges may not cross, so a word boundary placed
/// differently changes the ids.
#[test]
fn gpt4o_split_on_gpt2_vocab_matches_llama_tokenize() {
    check_jsonl_with(&retagged(&testdata("ggml-vocab-gpt-2.gguf"), "gpt-4o"), "gpt-4o.gpt-2.jsonl");
}

#[test]
fn gpt4o_split_on_llama3_vocab_matches_llama_tokenize() {
    let path = llama_models_dir().join("ggml-vocab-llama-bpe.gguf");
    if !path.exists() {
        eprintln!("SKIPPED: {} not found (set FERROX_LLAMA_CPP); gpt-4o.llama-bpe.jsonl was NOT checked", path.display());
        return;
    }
    check_jsonl_with(&retagged(&path, "gpt-4o"), "gpt-4o.llama-bpe.jsonl");
}

/// The split itself against llama.cpp's `unicode_regex_split`
/// (`tools/reftok/gen_split.py`): every word boundary, including those no
/// shipped vocabulary's merges would show in the ids. The file's first line
/// is the regex llama.cpp ran, which must be ferrox's copy.
#[test]
fn gpt4o_words_match_llama_cpp_unicode_regex_split() {
    let text = std::fs::read_to_string(testdata("gpt-4o.words.jsonl")).unwrap();
    let mut lines = text.lines();
    let head: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(head["regex"].as_str().unwrap(), super::unicode::GPT4O);
    let (mut n, mut bad) = (0, Vec::new());
    for line in lines {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let want: Vec<Vec<u8>> = case["words_hex"].as_array().unwrap().iter().map(|w| hex(w.as_str().unwrap())).collect();
        let cpts = super::unicode::decode_lenient(&hex(case["text_hex"].as_str().unwrap()));
        let mut got = Vec::new();
        let mut at = 0;
        for len in super::unicode::split(&cpts, super::Split::Gpt4o).unwrap() {
            let mut w = Vec::new();
            for &c in &cpts[at..at + len] {
                super::unicode::encode(c, &mut w);
            }
            got.push(w);
            at += len;
        }
        if got != want {
            let show = |ws: &[Vec<u8>]| ws.iter().map(|w| String::from_utf8_lossy(w).into_owned()).collect::<Vec<_>>();
            bad.push(format!("{}: want {:?}\n    got {:?}", case["name"], show(&want), show(&got)));
        }
        n += 1;
    }
    assert!(n >= 100, "only {n} cases");
    assert!(bad.is_empty(), "{} of {n} splits differ from llama.cpp:\n{}", bad.len(), bad.join("\n"));
}

/// Long runs of one class (which a backtracking engine would have to
/// remember position by position) split, worked out by hand: capitals then
/// one small letter are one word; spaces before a letter leave their last
/// space to it; a lone digit run goes by threes.
#[test]
fn gpt4o_long_runs_split_without_error() {
    let n = 200_000;
    let split = |s: &str| super::unicode::split(&super::unicode::decode_lenient(s.as_bytes()), super::Split::Gpt4o).unwrap();
    assert_eq!(split(&format!("{}b", "A".repeat(n))), vec![n + 1]);
    assert_eq!(split(&format!("{}x", " ".repeat(n))), vec![n - 1, 2]);
    assert_eq!(split(&" ".repeat(n)), vec![n]);
    let digits = split(&"7".repeat(n - 2));
    assert_eq!((digits.len(), digits.iter().all(|&l| l == 3)), ((n - 2) / 3, true));
}

#[test]
fn gpt4o_family_names_load_and_unknown_ones_are_refused() {
    let gpt2 = testdata("ggml-vocab-gpt-2.gguf");
    for pre in ["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"] {
        let tok = retagged(&gpt2, pre);
        assert_eq!(tok.kind, super::Kind::Bpe(super::Split::Gpt4o), "{pre}");
    }
    let file = GgufFile::open(&gpt2).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        let v = if k == "tokenizer.ggml.pre" { Value::from("gpt-5x") } else { v.clone() };
        w.set(k.clone(), v).unwrap();
    }
    let f = GgufFile::from_bytes(&w.to_bytes()).unwrap();
    assert!(matches!(Tokenizer::from_gguf(&f), Err(TokenizerError::UnsupportedPreTokenizer(p)) if p == "gpt-5x"));
}

/// A hand-made `llama` vocab: every byte token, and pieces whose scores make
/// the merge order matter.
fn tiny_spm(extra: &[(&str, f32, i32)]) -> Vec<u8> {
    let mut toks: Vec<(String, f32, i32)> = vec![("<unk>".into(), 0.0, 2), ("<s>".into(), 0.0, 3), ("</s>".into(), 0.0, 3)];
    for b in 0..=255u8 {
        toks.push((format!("<0x{b:02X}>"), 0.0, 6));
    }
    for &(t, s, ty) in extra {
        toks.push((t.to_string(), s, ty));
    }
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.model", "llama").unwrap();
    let strings: Vec<GgufString> = toks.iter().map(|t| GgufString::from(t.0.as_str())).collect();
    w.set("tokenizer.ggml.tokens", Value::Array(Array::String(strings.into()))).unwrap();
    w.set("tokenizer.ggml.scores", Value::Array(Array::F32(toks.iter().map(|t| t.1).collect()))).unwrap();
    w.set("tokenizer.ggml.token_type", Value::Array(Array::I32(toks.iter().map(|t| t.2).collect()))).unwrap();
    w.set("tokenizer.ggml.add_space_prefix", false).unwrap();
    w.to_bytes()
}

fn tiny(extra: &[(&str, f32, i32)]) -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::from_bytes(&tiny_spm(extra)).unwrap()).unwrap()
}

const BYTES: u32 = 3; // id of <0x00>
const FIRST: u32 = 3 + 256; // id of the first extra token

#[test]
fn spm_merges_the_highest_scoring_pair_first_not_the_best_segmentation() {
    // "abc": pairs "ab" (-1) and "bc" (-0.5); "bc" wins and "a" is left alone,
    // although "ab"+"c" would be the higher-probability Unigram path.
    let tok = tiny(&[("a", -5.0, 1), ("b", -5.0, 1), ("c", -0.1, 1), ("ab", -1.0, 1), ("bc", -0.5, 1)]);
    assert_eq!(tok.encode(b"abc", false, false).unwrap(), vec![FIRST, FIRST + 4]);
}

#[test]
fn spm_breaks_score_ties_toward_the_leftmost_pair() {
    let tok = tiny(&[("a", -5.0, 1), ("aa", -1.0, 1)]);
    assert_eq!(tok.encode(b"aaa", false, false).unwrap(), vec![FIRST + 1, FIRST]);
}

#[test]
fn spm_unknown_characters_fall_back_to_byte_tokens() {
    let tok = tiny(&[("a", -1.0, 1)]);
    // "é" is C3 A9 and not in the vocab.
    assert_eq!(tok.encode("aé".as_bytes(), false, false).unwrap(), vec![FIRST, BYTES + 0xC3, BYTES + 0xA9]);
}

#[test]
fn spm_spaces_are_escaped_and_control_tokens_need_parse_special() {
    let tok = tiny(&[("▁", -1.0, 1), ("x", -1.0, 1), ("<t>", 0.0, 3), ("<", -1.0, 1), (">", -1.0, 1), ("t", -1.0, 1)]);
    let sp = FIRST;
    let x = FIRST + 1;
    assert_eq!(tok.encode(b" x<t>x", false, true).unwrap(), vec![sp, x, FIRST + 2, x]);
    assert_eq!(tok.encode(b"<t>", false, false).unwrap(), vec![FIRST + 3, FIRST + 5, FIRST + 4]);
    assert_eq!(tok.encode(b"x", true, false).unwrap(), vec![1, x], "add_bos defaults to true for llama vocabs");
}

#[test]
fn missing_tokens_key_is_an_error_naming_the_key() {
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.model", "llama").unwrap();
    let f = GgufFile::from_bytes(&w.to_bytes()).unwrap();
    let e = Tokenizer::from_gguf(&f).err().unwrap();
    assert!(matches!(e, TokenizerError::MissingKey("tokenizer.ggml.tokens")), "{e}");
    assert!(e.to_string().contains("tokenizer.ggml.tokens"));
    let f = GgufFile::from_bytes(&GgufWriter::new().to_bytes()).unwrap();
    assert!(matches!(Tokenizer::from_gguf(&f), Err(TokenizerError::MissingKey("tokenizer.ggml.model"))));
}

#[test]
fn wrongly_typed_scores_are_an_error_naming_the_key() {
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.model", "llama").unwrap();
    w.set("tokenizer.ggml.tokens", Value::Array(Array::from(vec!["a", "b"]))).unwrap();
    w.set("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.0]))).unwrap();
    let f = GgufFile::from_bytes(&w.to_bytes()).unwrap();
    let e = Tokenizer::from_gguf(&f).err().unwrap();
    assert!(matches!(e, TokenizerError::InvalidKey { key: "tokenizer.ggml.scores", .. }), "{e}");
}

#[test]
fn unknown_tokenizer_model_is_refused() {
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.model", "t5").unwrap();
    let f = GgufFile::from_bytes(&w.to_bytes()).unwrap();
    assert!(matches!(Tokenizer::from_gguf(&f), Err(TokenizerError::UnsupportedModel(m)) if m == "t5"));
}

#[test]
fn detokenizer_never_splits_a_character_across_byte_tokens() {
    let tok = tiny(&[("a", -1.0, 1), ("▁", -1.0, 1)]);
    let ids = tok.encode("a🦙 a".as_bytes(), false, false).unwrap();
    // a, F0 9F A6 99, ▁, a
    assert_eq!(ids, vec![FIRST, BYTES + 0xF0, BYTES + 0x9F, BYTES + 0xA6, BYTES + 0x99, FIRST + 1, FIRST]);
    let mut d = Detokenizer::new(&tok, false);
    let outs: Vec<String> = ids.iter().map(|&id| d.push(id).unwrap()).collect();
    assert_eq!(outs, ["a", "", "", "", "🦙", " ", "a"]);
    assert_eq!(d.finish(), "");
}

#[test]
fn detokenizer_replaces_impossible_bytes_and_flushes_a_cut_tail() {
    let tok = tiny(&[]);
    let mut d = Detokenizer::new(&tok, false);
    assert_eq!(d.push(BYTES + 0xFF).unwrap(), "\u{FFFD}");
    assert_eq!(d.push(BYTES + b'x' as u32).unwrap(), "x");
    assert_eq!(d.push(BYTES + 0xE2).unwrap(), "");
    assert_eq!(d.push(BYTES + 0x82).unwrap(), "");
    assert_eq!(d.finish(), "\u{FFFD}");
}

#[test]
fn control_tokens_print_only_when_asked() {
    let tok = tiny(&[("<t>", 0.0, 3)]);
    assert_eq!(tok.piece(FIRST, false).unwrap(), b"");
    assert_eq!(tok.piece(FIRST, true).unwrap(), b"<t>");
    assert_eq!(tok.token_attr(FIRST), Some(attr::CONTROL));
    assert!(matches!(tok.piece(99_999, true), Err(TokenizerError::BadTokenId { id: 99_999, .. })));
}

/// gpt-oss's harmony tokens, as llama.cpp's vocabulary loader treats
/// them (`llama-vocab.cpp`): with `<|return|>` and `<|call|>` ending
/// generation, `<|end|>` (which closes each message, the reasoning
/// channel's included) does not, and it and the channel markup print
/// without `special`; a vocabulary without `<|call|>` keeps `<|end|>` as an
/// end of generation.
#[test]
fn harmony_end_closes_a_message_not_the_reply_and_its_markup_prints() {
    let harmony = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"];
    let tok = tiny(&harmony.map(|t| (t, 0.0, 3)));
    let id = |t: &str| FIRST + harmony.iter().position(|h| *h == t).unwrap() as u32;
    assert!(tok.is_eog(id("<|return|>")) && tok.is_eog(id("<|call|>")));
    assert!(!tok.is_eog(id("<|end|>")));
    // `<|end|>` was found as the end of turn by its text; it is not one.
    assert_eq!(tok.eot(), None);
    for t in ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>"] {
        assert_eq!(tok.piece(id(t), false).unwrap(), t.as_bytes(), "{t}");
    }
    assert_eq!(tok.piece(id("<|return|>"), false).unwrap(), b"");
    let text = tok.decode(&[id("<|channel|>"), BYTES + b'a' as u32, id("<|message|>"), id("<|end|>")], false).unwrap();
    assert_eq!(text, b"<|channel|>a<|message|><|end|>");
    let tok = tiny(&[("<|end|>", 0.0, 3), ("<|return|>", 0.0, 3)]);
    assert!(tok.is_eog(FIRST) && tok.is_eog(FIRST + 1));
}

#[test]
fn gpt2_vocab_round_trips_text_through_decode() {
    let file = GgufFile::open(testdata("ggml-vocab-gpt-2.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let text = "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～\n\t  x";
    let ids = tok.encode(text.as_bytes(), false, false).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text.as_bytes());
}

