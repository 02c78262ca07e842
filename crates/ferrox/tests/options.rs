//! The command line as llama.cpp and ollama users type it (issue 31): every
//! option checked before a model loads, llama.cpp's spellings and negative
//! numbers, errors said once on their own line. Run on the tiny models
//! `ferrox_core::testing` writes, so nothing here needs a download.

mod common;
use common::*;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use ferrox_core::arch::Arch;

/// A tiny model of `arch` (training context 256) in this test's scratch directory.
fn tiny(arch: Arch, name: &str) -> PathBuf {
    let path = scratch(name);
    if !path.exists() {
        // Tests run in parallel: written aside and renamed, so no test reads
        // a file another is still writing.
        let tmp = scratch(&format!("{name}.{:?}.tmp", std::thread::current().id()));
        ferrox_core::testing::tiny_arch_model(arch, 3).unwrap().write_to(&tmp).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

fn err(o: &Output) -> String {
    text(&o.stderr)
}

/// The number of lines of stderr that carry an error.
fn error_lines(o: &Output) -> usize {
    err(o).lines().filter(|l| l.contains("error")).count()
}

#[test]
fn a_bad_sampling_or_context_option_fails_before_the_load_and_before_the_prompt_is_echoed() {
    let model = tiny(Arch::Llama, "opt-llama.gguf");
    let m = model.to_str().unwrap();
    let cases: [(&[&str], &str); 8] = [
        (&["--top-p", "2"], "--top-p 2.0"),
        (&["--min-p", "1.5"], "--min-p 1.5"),
        (&["--temp", "nan"], "--temp NaN"),
        (&["--typical", "0"], "--typical 0.0"),
        (&["--presence-penalty", "3"], "--presence-penalty 3.0"),
        (&["--repeat-last-n", "-2"], "--repeat-last-n -2"),
        (&["--logit-bias", "99999999=1"], "vocabulary has"),
        (&["-c", "-4"], "not a context size"),
    ];
    for (flags, want) in cases {
        let o = ferrox(&[&["run", m, "-p", "Hello there"][..], flags].concat());
        assert_clean_error(&o, want);
        assert!(o.stdout.is_empty(), "{flags:?}: the prompt was echoed before the error: {:?}", text(&o.stdout));
        assert!(!err(&o).contains("loading"), "{flags:?}: the model was loaded before the check: {}", err(&o));
        assert!(err(&o).lines().any(|l| l.starts_with("ferrox: error:") || l.starts_with("error:")), "{flags:?}: the error starts its own line: {}", err(&o));
        assert_eq!(error_lines(&o), 1, "{flags:?}: said once: {}", err(&o));
    }
    // A context too small for the prompt: known once the prompt is tokenized,
    // still before a byte of it is echoed.
    let o = ferrox(&["run", m, "-p", "the of and to in is the of", "-c", "1"]);
    assert_clean_error(&o, "the context holds 1");
    assert!(o.stdout.is_empty(), "echoed before the error: {:?}", text(&o.stdout));
    // chat checks the same options before it loads.
    let o = Command::new(env!("CARGO_BIN_EXE_ferrox")).args(["chat", m, "--top-p", "2"]).stdin(Stdio::null()).output().unwrap();
    assert_clean_error(&o, "--top-p 2.0");
    assert!(!err(&o).contains("loading"), "{}", err(&o));
}

#[test]
fn negative_numbers_mean_what_they_mean_in_llama_cpp() {
    let model = tiny(Arch::Gemma3, "opt-gemma3.gguf");
    let m = model.to_str().unwrap();
    let run = |flags: &[&str]| {
        let o = ferrox(&[&["run", m, "-p", "the of", "--ignore-eos", "--no-echo", "--seed", "5"][..], flags].concat());
        assert!(o.status.success(), "{flags:?}: {}", err(&o));
        o
    };
    // A negative temperature is greedy, as 0 is (llama.cpp: <= 0 is greedy).
    assert_eq!(text(&run(&["--temp", "-1", "-n", "12"]).stdout), text(&run(&["--temp", "0", "-n", "12"]).stdout));
    // -1 penalizes over the whole context.
    run(&["--repeat-last-n", "-1", "--repeat-penalty", "1.3", "-n", "12"]);
    run(&["--presence-penalty", "-0.5", "--frequency-penalty", "-0.5", "-n", "12"]);
    // -c 0 is the model's training context (256 for the tiny models), filled.
    let o = run(&["-c", "0", "-n", "-1", "-v", "--temp", "0"]);
    assert!(err(&o).contains("the context is full (256 positions"), "{}", err(&o));
}

#[test]
fn llama_cpp_spellings_are_read_or_refused_naming_the_ferrox_way() {
    let path = scratch("opt-phi3.gguf");
    ferrox_core::testing::tiny_arch_model(Arch::Phi3, 9).unwrap().write_to(&path).unwrap();
    let model = path;
    let m = model.to_str().unwrap();
    let base = ["run", m, "-p", "the of", "-n", "20", "--temp", "0", "--ignore-eos"];
    let run = |flags: &[&str]| ferrox(&[&base[..], flags].concat());
    // Accepted: they mean here what they mean in llama.cpp.
    let plain = run(&["--no-echo"]);
    assert!(plain.status.success(), "{}", err(&plain));
    for flags in [
        &["--no-display-prompt"][..],
        &["-no-cnv", "--no-echo"],
        &["-fa", "on", "--no-echo"],
        &["-ctk", "f16", "-ctv", "f16", "--no-echo"],
        &["--jinja", "--mmap", "--no-echo"],
        &["-ngl", "0", "--no-echo"],
    ] {
        let o = run(flags);
        assert!(o.status.success(), "{flags:?}: {}", err(&o));
        assert_eq!(text(&o.stdout), text(&plain.stdout), "{flags:?} changed the text");
    }
    // -r is a stop string, as llama.cpp's reverse prompt ends the turn.
    let full = text(&plain.stdout);
    let chars: Vec<char> = full.trim_end().chars().collect();
    assert!(chars.len() > 12, "need a longer greedy text: {full:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let at = full.find(&stop).unwrap();
    for flag in ["-r", "--reverse-prompt"] {
        let o = run(&["--no-echo", flag, &stop]);
        assert!(o.status.success(), "{flag}: {}", err(&o));
        assert_eq!(text(&o.stdout).trim_end_matches('\n'), &full[..at], "{flag} {stop:?}");
    }
    // Refused, each naming what to do instead, before anything is loaded.
    let refused: [(&[&str], &str); 7] = [
        (&["--mlock"], "drop the flag"),
        (&["--no-mmap"], "always memory-maps"),
        (&["-ctk", "q8_0"], "F16 only"),
        (&["-cnv"], "ferrox chat"),
        (&["-i"], "ferrox chat"),
        (&["-sys", "be brief"], "ferrox chat --system"),
        (&["-hf", "ggml-org/gemma-3-1b-it-GGUF"], "never downloads"),
    ];
    for (flags, want) in refused {
        let o = run(flags);
        assert_clean_error(&o, want);
        assert!(!err(&o).contains("loading"), "{flags:?}: refused only after the load: {}", err(&o));
    }
    let o = Command::new(env!("CARGO_BIN_EXE_ferrox")).args(["chat", m, "-no-cnv"]).stdin(Stdio::null()).output().unwrap();
    assert_clean_error(&o, "ferrox run");
    let o = ferrox(&["serve", m, "-nocb", "--port", "0"]);
    assert_clean_error(&o, "--parallel 1");
    // chat takes -sys as its system message.
    let chat = |flags: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ferrox"))
            .args([&["chat", m, "--temp", "0", "-n", "4", "-v"][..], flags].concat())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"the of\n").unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{flags:?}: {}", err(&o));
        text(&o.stderr).lines().filter(|l| l.starts_with("ferrox: turn:")).map(String::from).collect::<Vec<_>>()
    };
    assert_eq!(chat(&["-sys", "be brief"]), chat(&["--system", "be brief"]));
    assert_ne!(chat(&["-sys", "be brief"]), chat(&[]), "-sys was not used as the system message");
}

#[test]
fn a_bad_model_file_is_one_clear_message_naming_it_once() {
    let dir = scratch("a-directory");
    std::fs::create_dir_all(&dir).unwrap();
    let not_gguf = scratch("notes.txt");
    std::fs::write(&not_gguf, "hello, this is text").unwrap();
    let good = tiny(Arch::Llama, "opt-cut-src.gguf");
    let bytes = std::fs::read(&good).unwrap();
    let cut = scratch("opt-cut.gguf");
    let n = bytes.len() * 2 / 3;
    std::fs::write(&cut, &bytes[..n]).unwrap();
    let head = scratch("opt-head.gguf");
    std::fs::write(&head, &bytes[..30]).unwrap();
    let missing = scratch("no-such-model.gguf");
    let cases: [(&PathBuf, String); 5] = [
        (&missing, "no such file".into()),
        (&dir, "is a directory".into()),
        (&not_gguf, "not a GGUF file".into()),
        (&cut, format!("truncated: {n} of {} bytes", bytes.len())),
        (&head, "truncated".into()),
    ];
    for (path, want) in cases {
        for cmd in ["info", "run", "tokenize"] {
            let p = path.to_str().unwrap();
            let args: Vec<&str> = match cmd {
                "info" => vec!["info", p],
                "run" => vec!["run", p, "-p", "hi"],
                _ => vec!["tokenize", p, "hi"],
            };
            let o = ferrox(&args);
            assert_clean_error(&o, &want);
            let e = err(&o);
            assert_eq!(e.matches(p).count(), 1, "{cmd} {p}: the path said once: {e}");
            assert!(e.matches("os error").count() <= 1, "{cmd} {p}: the cause said twice: {e}");
            assert_eq!(error_lines(&o), 1, "{cmd} {p}: {e}");
        }
    }
}

#[test]
fn serve_on_a_busy_port_fails_before_loading_the_model() {
    let model = tiny(Arch::Llama, "opt-serve.gguf");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let o = ferrox(&["serve", model.to_str().unwrap(), "--port", &port]);
    assert_clean_error(&o, &format!("cannot listen on 127.0.0.1:{port}"));
    assert!(!err(&o).contains("loading"), "the model was loaded before the port was tried: {}", err(&o));
}

/// `ferrox` with `FERROX_MODEL` naming `model` (the default model) and `stdin`.
fn ferrox_default(model: &std::path::Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrox"))
        .args(args)
        .env("FERROX_MODEL", model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn every_command_finds_the_model_and_the_text_the_same_ways() {
    let model = tiny(Arch::Gemma3, "opt-gemma3.gguf");
    let m = model.to_str().unwrap();
    let text_file = scratch("opt-text.txt");
    std::fs::write(&text_file, "the of and").unwrap();
    let f = text_file.to_str().unwrap();
    // info and tokenize fall back to the default model, as run does.
    let o = ferrox_default(&model, &["info"], "");
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("using the default model"), "{}", err(&o));
    let ids = |o: Output| {
        assert!(o.status.success(), "{}", err(&o));
        text(&o.stdout)
    };
    let want = ids(ferrox(&["tokenize", m, "the of and", "--ids"]));
    assert!(want.starts_with('[') && want.len() > 4, "{want}");
    for (args, stdin) in [
        (&["tokenize", "-p", "the of and", "--ids"][..], ""),
        (&["tokenize", "-f", f, "--ids"], ""),
        (&["tokenize", "-f", "-", "--ids"], "the of and"),
        (&["tokenize", m, "--ids"], "the of and"),
        (&["tokenize", "-m", m, "-p", "the of and", "--ids"], ""),
    ] {
        assert_eq!(ids(ferrox_default(&model, args, stdin)), want, "{args:?}");
    }
    // run: -p, -f FILE, -f - (stdin), and ollama's `run MODEL PROMPT`.
    let gen = |args: &[&str], stdin: &str| {
        let all = [args, &["-n", "8", "--temp", "0", "--ignore-eos", "--no-echo"][..]].concat();
        ids(ferrox_default(&model, &all, stdin))
    };
    let want = gen(&["run", m, "-p", "the of and"], "");
    assert!(!want.trim().is_empty());
    assert_eq!(gen(&["run", m, "-f", f], ""), want);
    assert_eq!(gen(&["run", m, "-f", "-"], "the of and"), want);
    assert_eq!(gen(&["run", m, "the of and"], ""), want);
    assert_eq!(gen(&["run", "-m", m, "the of and"], ""), want);
    assert_eq!(gen(&["run", "-p", "the of and"], ""), want);
}

#[test]
fn run_warns_about_options_past_the_machine_or_the_model_and_says_why_it_stopped() {
    let model = tiny(Arch::Gemma3, "opt-gemma3.gguf");
    let m = model.to_str().unwrap();
    let cores = std::thread::available_parallelism().unwrap().get();
    let threads = (cores + 1).to_string();
    let o = ferrox(&["run", m, "-p", "the of", "-n", "5", "--ignore-eos", "-t", &threads, "-c", "1000", "-v"]);
    assert!(o.status.success(), "{}", err(&o));
    let e = err(&o);
    assert!(e.contains(&format!("-t {threads} is more threads than the {cores} cores")), "{e}");
    assert!(e.contains("-c 1000 is past the model's training context (256)"), "{e}");
    assert!(e.contains("stopped: the -n limit (5 tokens)"), "{e}");
    assert!(!e.contains("Length"), "a Debug name is not a reason: {e}");
    let o = ferrox(&["run", m, "-p", "the of", "-n", "5", "-t", "1", "-c", "100"]);
    assert!(!err(&o).contains("warning"), "{}", err(&o));
}

#[test]
fn ctrl_c_in_run_ends_the_line_and_prints_what_was_done() {
    let model = tiny(Arch::Gemma3, "opt-gemma3.gguf");
    // A generation far longer than the test waits: until 200000 positions fill.
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrox"))
        .args(["run", model.to_str().unwrap(), "-p", "the of", "-n", "-1", "--ignore-eos", "--no-echo", "-c", "200000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 8];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let o = child.wait_with_output().unwrap();
    let e = err(&o);
    assert!(o.status.success(), "{:?}: {e}", o.status);
    assert!(o.stdout.ends_with(b"\n"), "the text's line is ended: {:?}", text(&o.stdout));
    assert!(e.contains("stopped: interrupted (Ctrl-C)") && e.contains("generated"), "{e}");
}

/// The line `serve` prints once it listens (its stderr up to then).
fn serve_startup(args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrox"))
        .args(["serve", "--port", "0"])
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = String::new();
    for line in std::io::BufRead::lines(std::io::BufReader::new(child.stderr.take().unwrap())) {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("serving on") || line.contains("error") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    seen
}

#[test]
fn serve_divides_the_context_among_its_slots_as_llama_server_does() {
    let model = tiny(Arch::Llama, "opt-serve.gguf");
    let m = model.to_str().unwrap();
    let e = serve_startup(&[m, "--parallel", "4", "-c", "512"]);
    assert!(e.contains("4 slots x 128 positions per slot"), "{e}");
    let e = serve_startup(&[m, "-np", "2", "-c", "0"]);
    assert!(e.contains("2 slots x 128 positions per slot"), "-c 0 is the training context (256): {e}");
    // Without -c each slot gets the model's context (at most 4096), as before.
    let e = serve_startup(&[m, "--parallel", "3"]);
    assert!(e.contains("3 slots x 256 positions per slot"), "{e}");
    let o = ferrox(&["serve", m, "--port", "0", "--parallel", "16", "-c", "8"]);
    assert_clean_error(&o, "leaves no position per slot");
}

#[test]
fn serve_logs_one_line_per_request() {
    use std::io::{BufRead, Read, Write};
    let model = tiny(Arch::Llama, "opt-serve.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrox"))
        .args(["serve", model.to_str().unwrap(), "--port", "0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let l = lines.next().expect("serve ended before listening").unwrap();
        if let Some(rest) = l.split("serving on http://").nth(1) {
            break rest.split(' ').next().unwrap().to_string();
        }
    };
    // The log read on its own thread, so a missing line fails rather than hangs.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| drop(tx.send(l))));
    let mut logged = Vec::new();
    for (method, path) in [("GET", "/health"), ("GET", "/v1/chat/completions")] {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        logged.push(rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap_or_default());
    }
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
    assert!(logged[0].starts_with("ferrox: GET /health 200 in "), "{logged:?}");
    assert!(logged[1].starts_with("ferrox: GET /v1/chat/completions 405 in "), "{logged:?}");
}

#[test]
fn a_model_that_fails_to_load_ends_the_loading_line_before_the_error() {
    let path = scratch("opt-mamba.gguf");
    let meta = vec![("general.architecture".to_string(), ferrox_gguf::Value::from("mamba"))];
    let t = [ferrox_gguf::testing::TinyTensor::new("token_embd.weight", ferrox_quant::QuantKind::F32, &[8, 4])];
    ferrox_gguf::testing::tiny_model(1, meta, &t, ferrox_gguf::testing::Fill::Quantize).unwrap().write_to(&path).unwrap();
    let o = ferrox(&["run", path.to_str().unwrap(), "-p", "hi"]);
    assert_clean_error(&o, "unsupported architecture");
    assert!(err(&o).lines().any(|l| l.starts_with("ferrox: error: ")), "the error shares a line: {}", err(&o));
}

/// On a terminal the load draws a bar (indicatif: bytes placed of the total),
/// then leaves the same line a pipe gets (which the tests above read, piped).
/// The terminal is `script`'s pty.
#[test]
fn a_load_on_a_terminal_draws_a_progress_bar() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("SKIPPED: `script` (util-linux) is not installed; the progress bar on a terminal was NOT checked");
        return;
    }
    let model = tiny(Arch::Llama, "opt-llama.gguf");
    let cmd = format!("{} run {} -p 'the of' -n 2", env!("CARGO_BIN_EXE_ferrox"), model.display());
    let o = Command::new("script").args(["-qec", &cmd, "/dev/null"]).stdin(Stdio::null()).output().unwrap();
    let all = text(&o.stdout);
    assert!(o.status.success(), "{all}");
    assert!(all.contains("ferrox: loading opt-llama.gguf ") && all.contains(" B/"), "no bar drawn: {all:?}");
    assert!(all.contains("ferrox: loading ") && all.contains(" ... tiny random model"), "the plain line after the bar: {all:?}");
}

/// `serve -md` drafts with a model of the target's vocabulary (its startup
/// line says so, and `--lookup` likewise), and refuses, before serving, a
/// draft whose vocabulary differs (one token's text changed).
#[test]
fn serve_takes_a_draft_model_and_refuses_one_of_another_vocabulary() {
    let model = tiny(Arch::Llama, "opt-serve.gguf");
    let m = model.to_str().unwrap();
    let draft = tiny(Arch::Gemma3, "opt-serve-draft.gguf");
    let d = draft.to_str().unwrap();
    let e = serve_startup(&[m, "-md", d, "--draft-max", "3"]);
    assert!(e.contains("serving on") && e.contains("speculative: draft model") && e.contains("0..=3 drafts"), "{e}");
    let e = serve_startup(&[m, "--lookup"]);
    assert!(e.contains("speculative: prompt lookup"), "{e}");
    let mut bytes = std::fs::read(&draft).unwrap();
    let word = "\u{2581}which".as_bytes();
    let at = bytes.windows(word.len()).position(|w| w == word).unwrap();
    bytes[at + word.len() - 1] = b'k';
    let other = scratch("opt-serve-draft-other.gguf");
    std::fs::write(&other, bytes).unwrap();
    // Through serve_startup, so a server that wrongly starts fails the test
    // instead of serving forever.
    let e = serve_startup(&[m, "-md", other.to_str().unwrap()]);
    assert!(!e.contains("serving on") && e.contains("error") && e.contains("speculative decoding needs one tokenizer"), "{e}");
    let e = serve_startup(&[m, "-md", d, "--draft-max", "7"]);
    assert!(!e.contains("serving on") && e.contains("--draft-max 7 is outside"), "{e}");
}
