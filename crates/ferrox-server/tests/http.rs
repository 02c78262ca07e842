//! The server end to end over loopback HTTP, on a tiny random-weight model:
//! response shapes, SSE, errors, auth, back-pressure, cancellation, shutdown.
//! The client is a few lines of HTTP/1.1 over `TcpStream`, so what is tested
//! is the bytes a real client receives.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrox_core::arch::Arch;
use ferrox_core::backend::cpu::Cpu;
use ferrox_core::backend::DeviceBackend;
use ferrox_core::chat_template::{ChatMessage, ChatTemplate};
use ferrox_core::embed::{cosine, Pooling};
use ferrox_core::generate::{GenerateOptions, Session};
use ferrox_core::model::Model;
use ferrox_core::sampling::SamplingParams;
use ferrox_core::scheduler::{Scheduler, SchedulerConfig, SpecConfig, SpecDrafter};
use ferrox_core::speculative::DraftParams;
use ferrox_core::tokenizer::Tokenizer;
use ferrox_server::{AppState, ServerOptions};
use serde_json::{json, Value};

fn tiny_path() -> PathBuf {
    tiny_seeded_path(11)
}

fn tiny_seeded_path(seed: u64) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("serve-tiny-{}-{seed}.gguf", std::process::id()));
    if !path.exists() {
        let tmp = dir.join(format!(
            "serve-tiny-{}-{seed}-{:?}.tmp",
            std::process::id(),
            std::thread::current().id()
        ));
        ferrox_core::testing::tiny_arch_model(Arch::Gemma3, seed)
            .unwrap()
            .write_to(&tmp)
            .unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

/// The tiny model (seed 11) carrying gpt-oss's chat template, whose
/// `<|channel|>` makes the server read replies as harmony.
fn harmony_path() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("serve-tiny-harmony-{}.gguf", std::process::id()));
    if !path.exists() {
        let src = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../ferrox-core/testdata/chat_template/templates/openai-gpt-oss-120b.jinja"),
        )
        .unwrap();
        let tmp = dir.join(format!("serve-tiny-harmony-{}-{:?}.tmp", std::process::id(), std::thread::current().id()));
        let mut w = ferrox_core::testing::tiny_arch_model(Arch::Gemma3, 11).unwrap();
        w.set("tokenizer.chat_template", src.as_str()).unwrap();
        w.write_to(&tmp).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

struct TestServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    fn start(cfg: SchedulerConfig, api_key: Option<&str>) -> TestServer {
        TestServer::start_with_grace(cfg, api_key, Duration::from_secs(5))
    }

    fn start_with_grace(cfg: SchedulerConfig, api_key: Option<&str>, grace: Duration) -> TestServer {
        TestServer::start_full(cfg, api_key, grace, None, None)
    }

    /// The tiny model with gpt-oss's own chat template (harmony).
    fn start_harmony(cfg: SchedulerConfig) -> TestServer {
        TestServer::start_model(harmony_path(), cfg, None, Duration::from_secs(5), None, None)
    }

    /// A server whose engine drafts with the tiny model of `draft_seed`
    /// (the target's own weights at 11), up to `max` tokens a step.
    fn start_speculative(cfg: SchedulerConfig, draft_seed: u64, max: usize) -> TestServer {
        let draft = Model::open(tiny_seeded_path(draft_seed), Cpu::new(2)).unwrap();
        let spec = SpecConfig {
            drafter: SpecDrafter::Model { model: Box::new(draft), p_min: 0.0 },
            params: DraftParams { max, min: 0 },
        };
        TestServer::start_full(cfg, None, Duration::from_secs(5), Some(spec), None)
    }

    /// With `--embeddings --pooling P` when `embed` is given.
    fn start_embedding(cfg: SchedulerConfig, api_key: Option<&str>, pooling: Pooling) -> TestServer {
        TestServer::start_full(cfg, api_key, Duration::from_secs(5), None, Some(pooling))
    }

    fn start_full(
        cfg: SchedulerConfig,
        api_key: Option<&str>,
        grace: Duration,
        spec: Option<SpecConfig<Cpu>>,
        embed: Option<Pooling>,
    ) -> TestServer {
        TestServer::start_model(tiny_path(), cfg, api_key, grace, spec, embed)
    }

    fn start_model(
        path: PathBuf,
        cfg: SchedulerConfig,
        api_key: Option<&str>,
        grace: Duration,
        spec: Option<SpecConfig<Cpu>>,
        embed: Option<Pooling>,
    ) -> TestServer {
        let model = Model::open(&path, Cpu::new(2)).unwrap();
        let tok = Arc::new(Tokenizer::from_gguf(model.file().metadata_file()).unwrap());
        let template =
            ChatTemplate::from_gguf(model.file().metadata_file()).map_err(|e| e.to_string());
        let (sched, engine) =
            Scheduler::start_speculative(model, Arc::clone(&tok), cfg, spec).unwrap();
        let opts = ServerOptions {
            model_name: "tiny".into(),
            api_key: api_key.map(String::from),
            shutdown_grace: grace,
            verbose: true,
            embeddings: embed.is_some(),
            pooling: embed.unwrap_or(Pooling::None),
            model_path: path.display().to_string(),
        };
        let state = AppState::new(sched, tok, template, opts);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(listener).unwrap();
                ferrox_server::serve(l, state, async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
            });
            engine.join().unwrap();
        });
        TestServer {
            addr,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    /// Sends SIGTERM's equivalent and waits for the server to end.
    fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    s
}

fn read_reply(s: TcpStream) -> Reply {
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').unwrap();
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            let n = usize::from_str_radix(line.trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).unwrap();
            body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        // A server that keeps the connection open (chromedriver) ends the
        // body by its length, not by closing.
        body.resize(n, 0);
        r.read_exact(&mut body).unwrap();
    } else {
        r.read_to_end(&mut body).unwrap();
    }
    Reply {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    }
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    read_reply(send(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    ))
}

fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    read_reply(send(addr, "GET", path, headers, b""))
}

/// The `data:` payloads of an SSE body, in order.
fn sse_events(body: &str) -> Vec<String> {
    assert!(
        body.ends_with("\n\n"),
        "an SSE body ends with a blank line: {body:?}"
    );
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event without data: {e:?}"))
                .to_string()
        })
        .collect()
}

fn cfg(n_slots: usize, queue: usize) -> SchedulerConfig {
    SchedulerConfig {
        n_slots,
        n_ctx: 256,
        n_batch: 64,
        queue_capacity: queue,
    }
}

fn greedy_chat(max: u64) -> Value {
    json!({"model": "tiny", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
           "temperature": 0, "max_tokens": max, "ignore_eos": true})
}

#[test]
fn a_chat_completion_returns_the_text_and_usage() {
    let srv = TestServer::start(cfg(2, 8), None);
    let r = post(srv.addr, "/v1/chat/completions", &greedy_chat(8));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(v["choices"][0]["message"]["content"].is_string());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // The prompt as the chat template renders it, counted independently.
    let model = Model::open(tiny_path(), Cpu::new(1)).unwrap();
    let tok = Tokenizer::from_gguf(model.file().metadata_file()).unwrap();
    let t = ChatTemplate::from_gguf(model.file().metadata_file()).unwrap();
    let text = t
        .render(
            &[
                ChatMessage::new("system", "be brief"),
                ChatMessage::new("user", "hello there"),
            ],
            true,
        )
        .unwrap();
    let n_prompt = tok
        .encode(text.as_bytes(), !t.starts_with_bos(&text), true)
        .unwrap()
        .len();
    assert_eq!(v["usage"]["prompt_tokens"], n_prompt);
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["usage"]["total_tokens"], n_prompt + 8);
}

#[test]
fn completions_match_a_lone_session_token_for_token() {
    let prompt = "the quick brown fox";
    let model = Model::open(tiny_path(), Cpu::new(2)).unwrap();
    let tok = Tokenizer::from_gguf(model.file().metadata_file()).unwrap();
    let ids = tok.encode(prompt.as_bytes(), true, true).unwrap();
    let mut s = Session::new(&model, &tok, 256).unwrap();
    let opts = GenerateOptions {
        max_tokens: Some(10),
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let want = s
        .generate(&ids, &opts, &AtomicBool::new(false), &mut |_| {})
        .unwrap();

    let srv = TestServer::start(cfg(2, 8), None);
    let body = json!({"prompt": prompt, "max_tokens": 10, "temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0, "ignore_eos": true, "logprobs": 2});
    let v = post(srv.addr, "/v1/completions", &body).json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], want.text.as_str());
    let lp = &v["choices"][0]["logprobs"];
    let got_lp: Vec<f64> = lp["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(got_lp.len(), 10);
    for (g, w) in got_lp.iter().zip(&want.tokens) {
        assert!(
            (g - w.sampled.logprob as f64).abs() < 1e-5,
            "{g} vs {}",
            w.sampled.logprob
        );
    }
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(v["usage"]["prompt_tokens"], ids.len());
}

#[test]
fn streamed_chunks_concatenate_to_the_non_streamed_text_and_end_with_done() {
    let srv = TestServer::start(cfg(2, 8), None);
    let whole = post(srv.addr, "/v1/chat/completions", &greedy_chat(12)).json();
    let mut body = greedy_chat(12);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = post(srv.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let events = sse_events(&r.body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage["usage"][k], whole["usage"][k], "{k}");
    }
    let fin = &chunks[chunks.len() - 2];
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        text,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );
}

#[test]
fn malformed_and_out_of_range_requests_get_openai_error_bodies() {
    let srv = TestServer::start(cfg(1, 8), None);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let cases: Vec<(Vec<u8>, Option<&str>)> = vec![
        (b"{not json".to_vec(), None),
        (b"".to_vec(), None),
        (json!({"messages": msgs, "temperature": "hot"}).to_string().into_bytes(), None),
        (json!({"messages": "hi"}).to_string().into_bytes(), None),
        (json!({}).to_string().into_bytes(), None),
        (json!({"messages": []}).to_string().into_bytes(), Some("messages")),
        (json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string().into_bytes(), Some("messages[0].role")),
        (json!({"messages": msgs, "max_tokens": -1}).to_string().into_bytes(), Some("max_tokens")),
        (json!({"messages": msgs, "max_tokens": 0}).to_string().into_bytes(), Some("max_tokens")),
        (json!({"messages": msgs, "temperature": 7.5}).to_string().into_bytes(), Some("temperature")),
        (json!({"messages": msgs, "n": 1000}).to_string().into_bytes(), Some("n")),
        (json!({"messages": msgs, "logprobs": true, "top_logprobs": 50}).to_string().into_bytes(), Some("top_logprobs")),
        (json!({"messages": msgs, "presence_penalty": 3}).to_string().into_bytes(), Some("presence_penalty")),
        (json!({"messages": msgs, "logit_bias": {"abc": 1}}).to_string().into_bytes(), Some("logit_bias")),
        (json!({"messages": msgs, "logit_bias": {"999999999": 1}}).to_string().into_bytes(), Some("logit_bias")),
        (json!({"messages": msgs, "stream_options": {"include_usage": "yes"}}).to_string().into_bytes(), None),
        (json!({"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {}}}}}).to_string().into_bytes(), Some("response_format")),
        (json!({"messages": msgs, "response_format": {"type": "yaml"}}).to_string().into_bytes(), None),
    ];
    for (body, param) in cases {
        let r = read_reply(send(
            srv.addr,
            "POST",
            "/v1/chat/completions",
            &[("Content-Type", "application/json")],
            &body,
        ));
        let shown = String::from_utf8_lossy(&body);
        assert_eq!(r.status, 400, "{shown}: {}", r.body);
        let v = r.json();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{shown}");
        assert!(
            !v["error"]["message"].as_str().unwrap().is_empty(),
            "{shown}"
        );
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{shown}: {}", r.body);
        }
    }
    // The server is still serving.
    assert_eq!(
        post(srv.addr, "/v1/chat/completions", &greedy_chat(2)).status,
        200
    );
}

#[test]
fn a_prompt_longer_than_the_context_is_a_400_saying_so() {
    let srv = TestServer::start(
        SchedulerConfig {
            n_slots: 1,
            n_ctx: 32,
            n_batch: 16,
            queue_capacity: 4,
        },
        None,
    );
    let long = "word ".repeat(200);
    let r = post(
        srv.addr,
        "/v1/completions",
        &json!({"prompt": long, "max_tokens": 4}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("32"),
        "{}",
        r.body
    );
}

#[test]
fn requests_without_the_api_key_get_401() {
    let srv = TestServer::start(cfg(1, 4), Some("sekrit"));
    assert_eq!(get(srv.addr, "/health", &[]).status, 200);
    let r = get(srv.addr, "/v1/models", &[]);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    assert_eq!(
        get(srv.addr, "/v1/models", &[("Authorization", "Bearer wrong")]).status,
        401
    );
    assert_eq!(
        post(srv.addr, "/v1/chat/completions", &greedy_chat(2)).status,
        401
    );
    let ok = get(
        srv.addr,
        "/v1/models",
        &[("Authorization", "Bearer sekrit")],
    );
    assert_eq!(ok.status, 200);
    assert_eq!(ok.json()["data"][0]["id"], "tiny");
}

/// Opens a streaming request and returns once its first event has arrived.
fn open_stream(addr: SocketAddr, max: u64) -> BufReader<TcpStream> {
    let mut body = greedy_chat(max);
    body["stream"] = json!(true);
    let s = send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    let mut r = BufReader::new(s);
    let mut line = String::new();
    while !line.contains("data:") {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the stream ended before its first event"
        );
    }
    r
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    // A context long enough that A cannot finish while the test runs.
    let srv = TestServer::start(
        SchedulerConfig {
            n_slots: 1,
            n_ctx: 1 << 16,
            n_batch: 64,
            queue_capacity: 1,
        },
        None,
    );
    let a = open_stream(srv.addr, 100_000);
    // B waits in the queue (the one slot is A's); C finds the queue full.
    let addr = srv.addr;
    let b = std::thread::spawn(move || post(addr, "/v1/chat/completions", &greedy_chat(2)).status);
    let t0 = Instant::now();
    while !get(srv.addr, "/metrics", &[])
        .body
        .contains("\nferrox_queue_depth 1\n")
    {
        assert!(t0.elapsed() < Duration::from_secs(30), "B never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    let c = post(srv.addr, "/v1/chat/completions", &greedy_chat(2));
    assert_eq!(c.status, 429, "{}", c.body);
    assert_eq!(c.header("retry-after"), Some("1"));
    assert_eq!(c.json()["error"]["code"], "queue_full");
    drop(a);
    assert_eq!(
        b.join().unwrap(),
        200,
        "the queued request runs once the slot is free"
    );
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_slot() {
    let srv = TestServer::start(
        SchedulerConfig {
            n_slots: 1,
            n_ctx: 1 << 16,
            n_batch: 64,
            queue_capacity: 4,
        },
        None,
    );
    let a = open_stream(srv.addr, 100_000);
    drop(a);
    // Only one slot: this completes only if the abandoned stream released it.
    let r = post(srv.addr, "/v1/chat/completions", &greedy_chat(3));
    assert_eq!(r.status, 200);
    let m = get(srv.addr, "/metrics", &[]).body;
    let value = |name: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {name} in {m}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("ferrox_sequences_cancelled_total"), 1.0);
    assert!(
        value("ferrox_generated_tokens_total") < 5000.0,
        "the abandoned stream kept generating"
    );
}

#[test]
fn metrics_are_prometheus_text_with_the_engine_counters() {
    let srv = TestServer::start(cfg(1, 4), None);
    let reply = post(srv.addr, "/v1/chat/completions", &greedy_chat(5));
    assert_eq!(reply.status, 200);
    let n_prompt = reply.json()["usage"]["prompt_tokens"].as_f64().unwrap();
    let r = get(srv.addr, "/metrics", &[]);
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    for l in r.body.lines().filter(|l| !l.starts_with('#')) {
        let (name, v) = l.rsplit_once(' ').unwrap();
        assert!(name.starts_with("ferrox_"), "{l}");
        v.parse::<f64>()
            .unwrap_or_else(|_| panic!("not a number: {l}"));
    }
    assert!(r
        .body
        .contains("# TYPE ferrox_time_to_first_token_seconds histogram"));
    assert!(
        r.body.contains("\nferrox_generated_tokens_total 5\n"),
        "{}",
        r.body
    );
    assert!(r.body.contains("\nferrox_requests_chat_total 1\n"));
    // The busy time splits into its forward passes and its sampling, both
    // seen moving, neither past the whole.
    let value = |name: &str| -> f64 {
        r.body
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {name} in {}", r.body))
            .parse()
            .unwrap()
    };
    let busy = value("ferrox_engine_busy_seconds_total");
    let (fwd, sample) = (
        value("ferrox_engine_forward_seconds_total"),
        value("ferrox_engine_sample_seconds_total"),
    );
    assert!(fwd > 0.0 && sample > 0.0, "forward {fwd} s, sampling {sample} s");
    // (busy is counted in whole microseconds a step, the parts in nanoseconds.)
    let steps = value("ferrox_engine_steps_total");
    assert!(
        fwd + sample <= busy + steps * 1e-6,
        "forward {fwd} s + sampling {sample} s past busy {busy} s"
    );
    assert!(r
        .body
        .contains("\nferrox_time_to_first_token_seconds_count 1\n"));
    // The slot keeps the prompt and every generated token but the last
    // (never evaluated), of one slot of 256 positions.
    assert_eq!(value("ferrox_kv_cache_tokens"), n_prompt + 4.0);
    assert_eq!(value("ferrox_kv_cache_usage_ratio"), (n_prompt + 4.0) / 256.0);
    // The CPU backend reads every logits row whole: one a generated token.
    assert_eq!(value("ferrox_engine_rows_whole_total"), 5.0);
    assert_eq!(value("ferrox_engine_rows_selected_total"), 0.0);
    // On the host there is no device memory to report (a CUDA backend's
    // gauges show in the device runs: scripts/cuda-serve.sh prints them
    // beside nvidia-smi's figure).
    assert!(!r.body.contains("ferrox_device_memory"), "{}", r.body);
}

#[test]
fn n_choices_with_a_seed_are_reproducible_and_each_is_the_seed_plus_its_index() {
    let srv = TestServer::start(cfg(4, 8), None);
    let req = |n: u64, seed: u64| {
        let mut b = greedy_chat(10);
        b["temperature"] = json!(1.5);
        b["top_k"] = json!(0);
        b["n"] = json!(n);
        b["seed"] = json!(seed);
        let v = post(srv.addr, "/v1/chat/completions", &b).json();
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["message"]["content"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let two = req(2, 5);
    assert_eq!(two.len(), 2);
    assert_eq!(req(2, 5), two, "same seed, same choices");
    assert_eq!(req(1, 5)[0], two[0]);
    assert_eq!(req(1, 6)[0], two[1]);
    assert_ne!(two[0], two[1], "choices of one request differ");
}

#[test]
fn json_schema_output_parses_and_follows_the_schema() {
    let srv = TestServer::start(cfg(2, 8), None);
    let schema = json!({"type": "object", "properties": {"color": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "null"}}}, "required": ["color", "ok"]});
    for seed in 0..3 {
        let body = json!({"messages": [{"role": "user", "content": "json please"}], "temperature": 1.0, "seed": seed, "max_tokens": 300,
                          "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}});
        let v = post(srv.addr, "/v1/chat/completions", &body).json();
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{content}");
        let out: Value =
            serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content:?}"));
        assert!(
            out["color"] == "red" || out["color"] == "green",
            "{content}"
        );
        assert!(out["ok"].is_boolean(), "{content}");
        let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
        assert!(
            keys.iter()
                .all(|k| ["color", "ok", "tags"].contains(&k.as_str())),
            "{content}"
        );
    }
}

#[test]
fn shutdown_lets_a_running_stream_finish_then_stops_listening() {
    let mut srv = TestServer::start(cfg(1, 4), None);
    let mut a = open_stream(srv.addr, 40);
    let addr = srv.addr;
    let stopper = std::thread::spawn(move || {
        srv.stop();
        srv
    });
    let mut rest = String::new();
    a.read_to_string(&mut rest).unwrap();
    // `rest` is the raw chunked body: the last event, then the final empty chunk.
    assert!(
        rest.contains("\"finish_reason\":\"length\""),
        "the stream ran to its budget: {rest}"
    );
    assert!(rest.ends_with("data: [DONE]\n\n\r\n0\r\n\r\n"), "{rest:?}");
    let _srv = stopper.join().unwrap();
    assert!(
        TcpStream::connect(addr).is_err(),
        "the server stopped listening"
    );
}

#[test]
fn the_openapi_document_lists_every_endpoint() {
    let srv = TestServer::start(cfg(1, 4), None);
    let v = get(srv.addr, "/openapi.json", &[]).json();
    assert_eq!(v["openapi"], "3.0.3");
    for p in [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/health",
        "/metrics",
        "/v1/embeddings",
        "/embeddings",
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/props",
    ] {
        assert!(v["paths"][p].is_object(), "{p}");
    }
    assert_eq!(
        v["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
            ["schema"]["properties"]["n"]["maximum"],
        16
    );
    let r = get(srv.addr, "/nope", &[]);
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "unknown_url");
}

/// A reply the server cut at shutdown (past its grace period) does not read
/// as a finished one: its finish_reason says it was cancelled.
#[test]
fn a_stream_cut_by_shutdown_says_cancelled_in_its_finish_reason() {
    let mut srv = TestServer::start_with_grace(cfg(1, 4), None, Duration::ZERO);
    let mut a = open_stream(srv.addr, 230);
    let stopper = std::thread::spawn(move || srv.stop());
    let mut rest = String::new();
    a.read_to_string(&mut rest).unwrap();
    stopper.join().unwrap();
    assert!(rest.contains("\"finish_reason\":\"cancelled\""), "{rest}");
    assert!(!rest.contains("\"finish_reason\":\"stop\""), "{rest}");
    assert!(rest.contains("data: [DONE]"), "{rest}");
}

/// A path asked with a method it does not take: 405, an OpenAI error body
/// (clients parse it), and `Allow`.
#[test]
fn a_method_a_route_does_not_take_is_a_405_with_a_json_body() {
    let srv = TestServer::start(cfg(1, 4), None);
    for (method, path, allowed) in [
        ("GET", "/v1/chat/completions", "POST"),
        ("GET", "/v1/completions", "POST"),
        ("POST", "/v1/models", "GET"),
        ("DELETE", "/health", "GET"),
        ("GET", "/v1/embeddings", "POST"),
        ("GET", "/tokenize", "POST"),
        ("POST", "/props", "GET"),
    ] {
        let r = read_reply(send(srv.addr, method, path, &[("Content-Type", "application/json")], b"{}"));
        assert_eq!(r.status, 405, "{method} {path}: {}", r.body);
        let v = r.json();
        assert_eq!(v["error"]["code"], "method_not_allowed", "{method} {path}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(path) && msg.contains(allowed), "{msg}");
        assert_eq!(r.header("allow"), Some(allowed), "{method} {path}");
    }
}

/// A field of the wrong type or a missing one: a 400 naming the field (as
/// `param` too) in JSON's words — no Rust type names, no parser positions.
#[test]
fn a_type_error_names_the_field_in_json_words() {
    let srv = TestServer::start(cfg(1, 8), None);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (json!({"messages": msgs, "temperature": "hot"}), "temperature", "a number"),
        (json!({"messages": msgs, "max_tokens": "5"}), "max_tokens", "the string \"5\""),
        (json!({}), "messages", "is required"),
        (json!({"messages": "hi"}), "messages", "an array"),
        (json!({"messages": msgs, "stream_options": {"include_usage": "yes"}}), "stream_options.include_usage", "a boolean"),
    ];
    for (body, param, words) in cases {
        let r = post(srv.addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let v = r.json();
        assert_eq!(v["error"]["param"], param, "{body}: {}", r.body);
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("`{param}`")) && msg.contains(words), "{body}: {msg}");
        for internal in ["f32", "u32", "usize", "line 1", "column", "struct "] {
            assert!(!msg.contains(internal), "{body}: serde's words in {msg:?}");
        }
    }
}

/// A metric's value in a `/metrics` body.
fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in {body}"))
        .parse()
        .unwrap()
}

/// Completions of several prompts of different lengths, sent together.
fn concurrent_completions(addr: SocketAddr, extra: &Value) -> Vec<Value> {
    let prompts = [("the quick brown fox", 24), ("hello", 9), ("one two three four five six", 17)];
    let threads: Vec<_> = prompts
        .iter()
        .map(|&(p, max)| {
            let mut body = json!({"prompt": p, "max_tokens": max, "temperature": 0, "ignore_eos": true});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            std::thread::spawn(move || {
                let r = post(addr, "/v1/completions", &body);
                assert_eq!(r.status, 200, "{}", r.body);
                r.json()
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Greedy text is the same with and without a draft model, for requests
/// decoding together: a draft of other weights (mostly rejected) and the
/// target's own (always kept); the response's `timings` report the drafts
/// only where the server speculates.
#[test]
fn greedy_text_is_identical_with_and_without_a_draft_model() {
    let text = |v: &Value| v["choices"][0]["text"].as_str().unwrap().to_string();
    let small = SchedulerConfig { n_slots: 3, n_ctx: 256, n_batch: 7, queue_capacity: 8 };
    let plain = TestServer::start(small, None);
    let want = concurrent_completions(plain.addr, &json!({}));
    for v in &want {
        assert!(v["timings"]["predicted_n"].as_u64().unwrap() > 0, "{v}");
        assert!(v["timings"].get("draft_n").is_none(), "a plain server reports no drafts: {v}");
    }
    for (seed, all_kept) in [(12, false), (11, true)] {
        let srv = TestServer::start_speculative(small, seed, 4);
        let got = concurrent_completions(srv.addr, &json!({}));
        let mut drafted = 0;
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(text(g), text(w), "draft seed {seed}");
            let (d, a) = (g["timings"]["draft_n"].as_u64().unwrap(), g["timings"]["draft_n_accepted"].as_u64().unwrap());
            assert!(a <= d);
            if all_kept {
                assert_eq!(a, d, "the target drafting for itself is always right");
            }
            drafted += d;
        }
        assert!(drafted > 0, "draft seed {seed}: nothing was drafted");
    }
}

/// The draft counters on `/metrics` move with what the requests report,
/// and the acceptance ratio is theirs; a request with `speculative.n_max`
/// 0 drafts nothing.
#[test]
fn metrics_count_drafted_and_accepted_tokens() {
    let srv = TestServer::start_speculative(cfg(2, 8), 11, 3);
    let before = get(srv.addr, "/metrics", &[]).body;
    assert_eq!(metric(&before, "ferrox_draft_tokens_total"), 0.0);
    let mut body = greedy_chat(12);
    let v = post(srv.addr, "/v1/chat/completions", &body).json();
    let (d, a) = (v["timings"]["draft_n"].as_u64().unwrap(), v["timings"]["draft_n_accepted"].as_u64().unwrap());
    assert!(d > 0 && a > 0, "{v}");
    body["speculative.n_max"] = json!(0);
    let off = post(srv.addr, "/v1/chat/completions", &body).json();
    assert_eq!(off["timings"]["draft_n"], 0, "{off}");
    assert_eq!(off["choices"][0]["message"]["content"], v["choices"][0]["message"]["content"]);
    let m = get(srv.addr, "/metrics", &[]).body;
    assert_eq!(metric(&m, "ferrox_draft_tokens_total"), d as f64);
    assert_eq!(metric(&m, "ferrox_draft_tokens_accepted_total"), a as f64);
    assert!((metric(&m, "ferrox_draft_acceptance_ratio") - a as f64 / d as f64).abs() < 1e-9);
}

/// JSON mode under speculation still gives JSON that follows the schema.
#[test]
fn json_schema_output_under_speculation_parses() {
    let srv = TestServer::start_speculative(cfg(2, 8), 11, 4);
    let schema = json!({"type": "object", "properties": {"color": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}}, "required": ["color", "ok"]});
    for (seed, temperature) in [(0, 0.0), (1, 1.0), (2, 1.0)] {
        let body = json!({"messages": [{"role": "user", "content": "json please"}], "temperature": temperature, "seed": seed, "max_tokens": 300,
                          "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}});
        let v = post(srv.addr, "/v1/chat/completions", &body).json();
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{content}");
        let out: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content:?}"));
        assert!(out["color"] == "red" || out["color"] == "green", "{content}");
        assert!(out["ok"].is_boolean(), "{content}");
        assert!(v["timings"]["draft_n"].as_u64().unwrap() > 0, "{v}");
    }
}

/// Bad `speculative.n_max` / `speculative.n_min` are 400s naming the field.
#[test]
fn bad_draft_sizes_are_400s_naming_the_field() {
    let srv = TestServer::start_speculative(cfg(1, 4), 11, 3);
    for (field, value, param) in [
        ("speculative.n_max", json!(7), "speculative.n_max"),
        ("speculative.n_max", json!(-1), "speculative.n_max"),
        ("speculative.n_max", json!("four"), "speculative.n_max"),
        ("speculative.n_min", json!(4), "speculative.n_min"),
    ] {
        let mut body = greedy_chat(4);
        body[field] = value.clone();
        let r = post(srv.addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{field} = {value}: {}", r.body);
        let v = r.json();
        assert_eq!(v["error"]["param"], param, "{field} = {value}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    let mut ok = greedy_chat(4);
    ok["speculative.n_max"] = json!(2);
    ok["speculative.n_min"] = json!(1);
    assert_eq!(post(srv.addr, "/v1/chat/completions", &ok).status, 200);
}

/// The tiny model's normed hidden states of `ids` (one pass of a fresh
/// context), pooled by hand and L2-normalized: what an OpenAI embedding of
/// them must be.
fn embedding_alone(ids: &[u32], pooling: Pooling) -> Vec<f32> {
    use ferrox_core::backend::Batch;
    let model = Model::open(tiny_path(), Cpu::new(2)).unwrap();
    let mut ctx = model.new_context(256, 1).unwrap();
    let mut b = Batch::default();
    for (i, &t) in ids.iter().enumerate() {
        b.push(t, i as u32, 0, true);
    }
    // The server's engine rounds products the same at every batch size.
    model.backend().prefer_exact_products();
    let h = model.forward_hidden(&mut ctx, &b).unwrap();
    let d = model.config().n_embd;
    let mut v: Vec<f32> = match pooling {
        Pooling::Mean => (0..d).map(|j| h.chunks_exact(d).map(|r| r[j]).sum::<f32>() / ids.len() as f32).collect(),
        Pooling::Cls => h[..d].to_vec(),
        Pooling::Last | Pooling::None => h[h.len() - d..].to_vec(),
    };
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

/// Cosine above which two embeddings are the same vector: the tiny random
/// model's hidden states move by ~1e-3 between batch shapes and thread
/// counts (a server's passes hold other requests' tokens); a wrong row or
/// pooling is far below.
const SAME: f64 = 0.9999;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap_or_else(|| panic!("not an array: {v}")).iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn encode(text: &str, add_special: bool) -> Vec<u32> {
    let model = Model::open(tiny_path(), Cpu::new(1)).unwrap();
    let tok = Tokenizer::from_gguf(model.file().metadata_file()).unwrap();
    tok.encode(text.as_bytes(), add_special, true).unwrap()
}

/// `/v1/embeddings`: one unit vector per input, in order, equal to the
/// model's hidden states pooled by hand; text, token ids and base64 agree;
/// usage counts the tokens.
#[test]
fn openai_embeddings_are_the_pooled_hidden_states_normalized() {
    for pooling in [Pooling::Mean, Pooling::Last, Pooling::Cls] {
        let srv = TestServer::start_embedding(cfg(2, 8), None, pooling);
        let texts = ["hello there", "the quick brown fox jumps over the lazy dog", "x"];
        let r = post(srv.addr, "/v1/embeddings", &json!({"model": "m", "input": texts}));
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["object"], "list");
        assert_eq!(v["model"], "m");
        let data = v["data"].as_array().unwrap();
        assert_eq!(data.len(), texts.len());
        let mut n_tokens = 0;
        for (i, (d, text)) in data.iter().zip(texts).enumerate() {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            let got = floats(&d["embedding"]);
            // Each value written in the f32's fewest digits, not the f64's 17.
            for x in d["embedding"].as_array().unwrap() {
                let f = x.as_f64().unwrap();
                assert_eq!(f, (f as f32).to_string().parse::<f64>().unwrap(), "{x} is not an f32's shortest form");
            }
            let ids = encode(text, true);
            n_tokens += ids.len();
            let want = embedding_alone(&ids, pooling);
            assert_eq!(got.len(), want.len());
            let norm: f32 = got.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "{pooling:?} {text:?}: |v| = {norm}");
            let c = cosine(&got, &want);
            assert!(c > SAME, "{pooling:?} {text:?}: cosine {c}");
        }
        assert_eq!(v["usage"]["prompt_tokens"], n_tokens);
        assert_eq!(v["usage"]["total_tokens"], n_tokens);
        // One string, the same as token ids, the same as base64 (separate
        // requests may reuse a cached prefix: equal to rounding).
        let one = post(srv.addr, "/v1/embeddings", &json!({"input": texts[1]})).json();
        let ids = post(srv.addr, "/v1/embeddings", &json!({"input": encode(texts[1], true)})).json();
        let b64 = post(srv.addr, "/v1/embeddings", &json!({"input": [texts[1]], "encoding_format": "base64"})).json();
        let f = floats(&one["data"][0]["embedding"]);
        let bytes = {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.decode(b64["data"][0]["embedding"].as_str().unwrap()).unwrap()
        };
        let decoded: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        for (what, other) in [
            ("token ids", floats(&ids["data"][0]["embedding"])),
            ("base64 (little-endian f32)", decoded),
            ("the same input among others", floats(&data[1]["embedding"])),
        ] {
            assert_eq!(other.len(), f.len(), "{what}");
            let c = cosine(&other, &f);
            assert!(c > SAME, "{pooling:?}: {what}: cosine {c}");
        }
    }
}

/// More inputs than the queue holds still run (the request feeds them a
/// slot at a time), and every one comes back in its place.
#[test]
fn an_embeddings_request_larger_than_the_queue_is_fed_through_it() {
    let srv = TestServer::start_embedding(cfg(1, 2), None, Pooling::Last);
    let texts: Vec<String> = (0..9).map(|i| format!("input number {i}")).collect();
    let r = post(srv.addr, "/v1/embeddings", &json!({"input": texts}));
    assert_eq!(r.status, 200, "{}", r.body);
    let data = r.json()["data"].as_array().unwrap().clone();
    assert_eq!(data.len(), 9);
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(data[i]["index"], i);
        let want = embedding_alone(&encode(t, true), Pooling::Last);
        let got = floats(&data[i]["embedding"]);
        assert!(cosine(&got, &want) > SAME, "input {i}");
    }
}

/// Without `--embeddings` both endpoints answer 501 (llama-server's
/// `not_supported_error`); with pooling `none`, OpenAI's endpoint is a 400
/// and llama-server's `/embeddings` gives one raw vector per token.
#[test]
fn embeddings_need_the_flag_and_pooling_none_gives_a_vector_per_token() {
    let srv = TestServer::start(cfg(1, 4), None);
    for path in ["/v1/embeddings", "/embeddings"] {
        let r = post(srv.addr, path, &json!({"input": "hi"}));
        assert_eq!(r.status, 501, "{path}: {}", r.body);
        let v = r.json();
        assert_eq!(v["error"]["type"], "not_supported_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("--embeddings"));
    }
    drop(srv);
    let srv = TestServer::start_embedding(cfg(1, 4), None, Pooling::None);
    let r = post(srv.addr, "/v1/embeddings", &json!({"input": "hi"}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("--pooling"), "{}", r.body);
    let text = "the quick brown fox";
    let r = post(srv.addr, "/embeddings", &json!({"content": text}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let ids = encode(text, true);
    let rows = v[0]["embedding"].as_array().unwrap();
    assert_eq!(v[0]["index"], 0);
    assert_eq!(rows.len(), ids.len(), "one vector per token");
    // The last token's row, raw: normalized, it is the last-token embedding.
    let mut last = floats(rows.last().unwrap());
    let norm = last.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() > 1e-3, "pooling none is not normalized (|v| = {norm})");
    last.iter_mut().for_each(|x| *x /= norm);
    let want = embedding_alone(&ids, Pooling::Last);
    assert!(cosine(&last, &want) > SAME, "{}", cosine(&last, &want));
    // The answer grows with the tokens: at most one slot's worth (256) per request.
    let r = post(srv.addr, "/embeddings", &json!({"content": vec!["one two three four"; 60]}));
    assert_eq!(r.status, 400, "{}", &r.body[..r.body.len().min(300)]);
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
}

#[test]
fn malformed_embedding_requests_are_400s_naming_the_field() {
    let srv = TestServer::start_embedding(
        SchedulerConfig { n_slots: 1, n_ctx: 32, n_batch: 16, queue_capacity: 4 },
        None,
        Pooling::Mean,
    );
    let long = "word ".repeat(200);
    let cases: Vec<(Value, Option<&str>, Option<&str>)> = vec![
        (json!({}), Some("input"), None),
        (json!({"input": []}), Some("input"), None),
        (json!({"input": [[]]}), Some("input[0]"), None),
        (json!({"input": 5}), Some("input"), None),
        (json!({"input": [1, "a"]}), Some("input"), None),
        (json!({"input": [5, 999999999]}), Some("input"), None),
        (json!({"input": "hi", "encoding_format": "hex"}), Some("encoding_format"), None),
        (json!({"input": "hi", "dimensions": 7}), Some("dimensions"), None),
        (json!({"input": ["ok", long]}), Some("input[1]"), Some("context_length_exceeded")),
        (json!({"input": vec!["a"; 2049]}), Some("input"), None),
    ];
    for (body, param, code) in cases {
        let r = post(srv.addr, "/v1/embeddings", &body);
        let shown: String = body.to_string().chars().take(80).collect();
        assert_eq!(r.status, 400, "{shown}: {}", r.body);
        let v = r.json();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{shown}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{shown}: {}", r.body);
        }
        if let Some(c) = code {
            assert_eq!(v["error"]["code"], c, "{shown}: {}", r.body);
        }
    }
    // An input that exactly fills the slot is fine (nothing is generated after it).
    let ids: Vec<u32> = (0..32).map(|i| 5 + i).collect();
    assert_eq!(post(srv.addr, "/v1/embeddings", &json!({"input": ids})).status, 200);
}

/// `/tokenize` and `/detokenize` as llama-server answers them.
#[test]
fn tokenize_and_detokenize_round_trip_as_llama_server_answers() {
    let srv = TestServer::start(cfg(1, 4), None);
    let text = "hello world, the quick brown fox";
    let plain = post(srv.addr, "/tokenize", &json!({"content": text}));
    assert_eq!(plain.status, 200, "{}", plain.body);
    let ids: Vec<u32> = plain.json()["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    assert_eq!(ids, encode(text, false), "add_special defaults to false");
    let with_bos = post(srv.addr, "/tokenize", &json!({"content": text, "add_special": true})).json();
    let want = encode(text, true);
    assert_eq!(with_bos["tokens"], json!(want));
    assert_ne!(want, ids, "the tiny model adds BOS");
    // Mixed content: only a first text gets BOS.
    let mixed = post(srv.addr, "/tokenize", &json!({"content": [7, "hello", 9], "add_special": true})).json();
    let mut m = vec![7];
    m.extend(encode("hello", false));
    m.push(9);
    assert_eq!(mixed["tokens"], json!(m));
    // Pieces: each token's text; together, the text.
    let pieces = post(srv.addr, "/tokenize", &json!({"content": text, "with_pieces": true})).json();
    // A piece that is not UTF-8 by itself comes as its bytes.
    let mut joined = Vec::new();
    for (p, &id) in pieces["tokens"].as_array().unwrap().iter().zip(&ids) {
        assert_eq!(p["id"], id);
        match &p["piece"] {
            Value::String(s) => joined.extend_from_slice(s.as_bytes()),
            Value::Array(b) => joined.extend(b.iter().map(|x| x.as_u64().unwrap() as u8)),
            other => panic!("piece {other}"),
        }
    }
    // The pieces are the tokenizer's (the tiny vocabulary's tokens are
    // user-defined: their text as written, `▁` and all).
    let model = Model::open(tiny_path(), Cpu::new(1)).unwrap();
    let tok = Tokenizer::from_gguf(model.file().metadata_file()).unwrap();
    let decoded = tok.decode(&ids, true).unwrap();
    assert_eq!(joined, decoded);
    assert_eq!(String::from_utf8_lossy(&decoded).replace('\u{2581}', " ").trim_start(), text);
    let back = post(srv.addr, "/detokenize", &json!({"tokens": ids}));
    assert_eq!(back.status, 200, "{}", back.body);
    assert_eq!(back.json()["content"].as_str().unwrap(), String::from_utf8_lossy(&decoded));
    // Absent fields: llama-server's empty answers.
    assert_eq!(post(srv.addr, "/tokenize", &json!({})).json(), json!({"tokens": []}));
    assert_eq!(post(srv.addr, "/detokenize", &json!({})).json(), json!({"content": ""}));
    for (path, body, param) in [
        ("/detokenize", json!({"tokens": [5, 999999999]}), Some("tokens")),
        ("/detokenize", json!({"tokens": "abc"}), Some("tokens")),
        ("/detokenize", json!({"tokens": [-1]}), Some("tokens[0]")),
        ("/tokenize", json!({"content": 5}), Some("content")),
        ("/tokenize", json!({"content": [1, 999999999]}), Some("content[1]")),
        ("/tokenize", json!({"content": "x", "with_pieces": "yes"}), Some("with_pieces")),
    ] {
        let r = post(srv.addr, path, &body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
        let v = r.json();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], json!(param), "{path} {body}: {}", r.body);
    }
    let r = read_reply(send(srv.addr, "POST", "/tokenize", &[("Content-Type", "application/json")], b"{nope"));
    assert_eq!(r.status, 400);
}

/// `/apply-template` renders what `/v1/chat/completions` tokenizes.
#[test]
fn apply_template_renders_the_messages_through_the_chat_template() {
    let srv = TestServer::start(cfg(1, 4), None);
    let msgs = json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]);
    let r = post(srv.addr, "/apply-template", &json!({"messages": msgs}));
    assert_eq!(r.status, 200, "{}", r.body);
    let model = Model::open(tiny_path(), Cpu::new(1)).unwrap();
    let t = ChatTemplate::from_gguf(model.file().metadata_file()).unwrap();
    let want = t.render(&[ChatMessage::new("system", "be brief"), ChatMessage::new("user", "hello there")], true).unwrap();
    assert_eq!(r.json(), json!({"prompt": want}));
    for (body, param) in [
        (json!({"messages": []}), "messages"),
        (json!({"messages": [{"role": "wizard", "content": "x"}]}), "messages[0].role"),
        (json!({}), "messages"),
        (json!({"messages": "hi"}), "messages"),
    ] {
        let r = post(srv.addr, "/apply-template", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{body}: {}", r.body);
    }
}

/// `/props` carries llama-server's fields with this server's values.
#[test]
fn props_reports_the_slots_context_model_and_template() {
    let srv = TestServer::start(cfg(3, 4), None);
    let r = get(srv.addr, "/props", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["total_slots"], 3);
    assert_eq!(v["default_generation_settings"]["n_ctx"], 256);
    assert_eq!(v["default_generation_settings"]["params"]["temperature"].as_f64().unwrap() as f32, 0.8);
    assert_eq!(v["default_generation_settings"]["params"]["top_k"], 40);
    assert_eq!(v["model_path"], tiny_path().display().to_string());
    let model = Model::open(tiny_path(), Cpu::new(1)).unwrap();
    let t = ChatTemplate::from_gguf(model.file().metadata_file()).unwrap();
    assert_eq!(v["chat_template"], t.source());
    assert!(v["build_info"].as_str().unwrap().starts_with("ferrox "));
    assert_eq!(v["embeddings"], false);
    assert_eq!(v["modalities"]["vision"], false);
}

/// The new endpoints sit behind the API key like the rest.
#[test]
fn the_utility_and_embedding_endpoints_need_the_api_key() {
    let srv = TestServer::start_embedding(cfg(1, 4), Some("sekrit"), Pooling::Mean);
    let auth = [("Content-Type", "application/json"), ("Authorization", "Bearer sekrit")];
    for (path, body) in [
        ("/v1/embeddings", json!({"input": "hi"})),
        ("/embeddings", json!({"content": "hi"})),
        ("/tokenize", json!({"content": "hi"})),
        ("/detokenize", json!({"tokens": [5]})),
        ("/apply-template", json!({"messages": [{"role": "user", "content": "hi"}]})),
    ] {
        let r = post(srv.addr, path, &body);
        assert_eq!(r.status, 401, "{path}: {}", r.body);
        let ok = read_reply(send(srv.addr, "POST", path, &auth, body.to_string().as_bytes()));
        assert_eq!(ok.status, 200, "{path}: {}", ok.body);
    }
    assert_eq!(get(srv.addr, "/props", &[]).status, 401);
    assert_eq!(get(srv.addr, "/props", &[("Authorization", "Bearer sekrit")]).status, 200);
}

// ---- The Ollama API (/api/*) ----

/// A streamed reply's body as its chunks (HTTP/1.1 chunked encoding), each
/// chunk as it was sent: the status, the Content-Type, the chunks.
fn read_chunks(s: TcpStream) -> (u16, String, Vec<String>) {
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (mut ct, mut chunked) = (String::new(), false);
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').unwrap();
        if k.eq_ignore_ascii_case("content-type") {
            ct = v.trim().to_string();
        }
        if k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked") {
            chunked = true;
        }
    }
    assert!(chunked, "a stream is sent chunked, as it is produced");
    let mut chunks = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let n = usize::from_str_radix(line.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        let mut chunk = vec![0; n + 2];
        r.read_exact(&mut chunk).unwrap();
        chunks.push(String::from_utf8(chunk[..n].to_vec()).unwrap());
    }
    (status, ct, chunks)
}

/// An NDJSON stream's objects, each checked to be one whole line sent as
/// its own chunk (a client reading line by line gets each as it comes).
fn ndjson_objects(chunks: &[String]) -> Vec<Value> {
    let mut out = Vec::new();
    for c in chunks {
        for line in c.split_inclusive('\n') {
            assert!(line.ends_with('\n'), "an NDJSON object ends its line: {line:?}");
            out.push(serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line:?}")));
        }
    }
    out
}

fn is_rfc3339_utc(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 20 && b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && b[13] == b':' && b[16] == b':' && s.ends_with('Z')
        && s[..4].parse::<u32>().is_ok_and(|y| y >= 2024)
}

/// The durations and counts ollama's last object carries, in nanoseconds.
fn assert_final_stats(v: &Value) {
    for k in ["total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"] {
        assert!(v[k].is_u64(), "{k} is a non-negative integer: {v}");
    }
    assert!(v["total_duration"].as_u64().unwrap() >= v["prompt_eval_duration"].as_u64().unwrap(), "{v}");
    assert!(v["total_duration"].as_u64().unwrap() > 0, "{v}");
}

fn ollama_chat_body(stream: bool, num_predict: u64) -> Value {
    json!({"model": "tiny", "stream": stream,
           "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
           "options": {"temperature": 0, "num_predict": num_predict, "repeat_penalty": 1.0}})
}

/// `/api/chat` answers what `/v1/chat/completions` answers for the same
/// conversation and greedy settings: the same text, the prompt and reply
/// counted alike; `num_predict` bounds `eval_count`; the stream (ollama's
/// default) is NDJSON whose pieces concatenate to the whole reply.
#[test]
fn ollama_chat_matches_the_openai_reply_and_streams_ndjson() {
    let srv = TestServer::start(cfg(2, 8), None);
    let oai = post(srv.addr, "/v1/chat/completions", &json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
        "temperature": 0, "max_tokens": 6})).json();
    let want = oai["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let r = post(srv.addr, "/api/chat", &ollama_chat_body(false, 6));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], "tiny");
    assert!(is_rfc3339_utc(v["created_at"].as_str().unwrap()), "{v}");
    assert_eq!(v["message"]["role"], "assistant");
    assert_eq!(v["message"]["content"], want.as_str());
    assert_eq!(v["done"], true);
    assert_eq!(v["done_reason"], if oai["choices"][0]["finish_reason"] == "length" { "length" } else { "stop" });
    assert_final_stats(&v);
    assert_eq!(v["eval_count"], oai["usage"]["completion_tokens"]);
    assert!(v["eval_count"].as_u64().unwrap() <= 6, "num_predict bounds eval_count: {v}");
    assert_eq!(v["prompt_eval_count"], oai["usage"]["prompt_tokens"]);
    assert!(v.get("context").is_none(), "chat replies carry no context: {v}");

    // The stream: no `stream` field means streaming, as in ollama.
    let mut body = ollama_chat_body(true, 6);
    body.as_object_mut().unwrap().remove("stream");
    let (status, ct, chunks) = read_chunks(send(srv.addr, "POST", "/api/chat", &[], body.to_string().as_bytes()));
    assert_eq!(status, 200);
    assert_eq!(ct, "application/x-ndjson");
    let objs = ndjson_objects(&chunks);
    assert_eq!(objs.len(), chunks.len(), "one object per chunk");
    let (last, pieces) = objs.split_last().unwrap();
    assert!(!pieces.is_empty(), "the reply comes in pieces before the last object");
    let mut text = String::new();
    for p in pieces {
        assert_eq!(p["done"], false, "{p}");
        assert_eq!(p["message"]["role"], "assistant");
        assert!(is_rfc3339_utc(p["created_at"].as_str().unwrap()), "{p}");
        assert!(p.get("eval_count").is_none(), "{p}");
        text.push_str(p["message"]["content"].as_str().unwrap());
    }
    assert_eq!(last["done"], true);
    assert_final_stats(last);
    text.push_str(last["message"]["content"].as_str().unwrap());
    assert_eq!(text, want);
    assert_eq!(last["eval_count"], v["eval_count"]);
}

/// `/api/generate`: templated by default, the prompt as it is with `raw`
/// (then equal to `/v1/completions`), and `context` is the prompt's tokens
/// then the reply's.
#[test]
fn ollama_generate_raw_equals_a_completion_and_returns_the_context() {
    let srv = TestServer::start(cfg(2, 8), None);
    let prompt = "the quick brown fox";
    let oai = post(srv.addr, "/v1/completions", &json!({"prompt": prompt, "temperature": 0, "max_tokens": 5})).json();
    let r = post(srv.addr, "/api/generate", &json!({"model": "tiny", "prompt": prompt, "raw": true, "stream": false,
        "options": {"temperature": 0, "num_predict": 5, "repeat_penalty": 1}}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["response"], oai["choices"][0]["text"]);
    assert_eq!(v["done"], true);
    assert_final_stats(&v);
    assert_eq!(v["eval_count"], oai["usage"]["completion_tokens"]);
    let ctx: Vec<u32> = v["context"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let ids = encode(prompt, true);
    assert_eq!(v["prompt_eval_count"], ids.len());
    assert_eq!(&ctx[..ids.len()], &ids[..], "context starts with the prompt's tokens");
    assert_eq!(ctx.len(), ids.len() + v["eval_count"].as_u64().unwrap() as usize);

    // Templated: the prompt as a user turn after the system message, as
    // /v1/chat/completions renders it; streamed by default.
    let chat = post(srv.addr, "/v1/chat/completions", &json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": prompt}],
        "temperature": 0, "max_tokens": 4})).json();
    let body = json!({"model": "tiny", "prompt": prompt, "system": "be brief", "options": {"temperature": 0, "num_predict": 4, "repeat_penalty": 1}});
    let (status, ct, chunks) = read_chunks(send(srv.addr, "POST", "/api/generate", &[], body.to_string().as_bytes()));
    assert_eq!((status, ct.as_str()), (200, "application/x-ndjson"));
    let objs = ndjson_objects(&chunks);
    let text: String = objs.iter().map(|o| o["response"].as_str().unwrap()).collect();
    assert_eq!(text, chat["choices"][0]["message"]["content"].as_str().unwrap());
    let last = objs.last().unwrap();
    assert_eq!(last["done"], true);
    assert_eq!(last["prompt_eval_count"], chat["usage"]["prompt_tokens"]);
    assert!(objs[..objs.len() - 1].iter().all(|o| o["done"] == false));

    // An empty prompt loads the model and generates nothing.
    let load = post(srv.addr, "/api/generate", &json!({"model": "tiny"}));
    assert_eq!(load.status, 200, "{}", load.body);
    assert_eq!(load.json()["done_reason"], "load");
    assert_eq!(load.json()["response"], "");
}

/// `format: "json"` and a schema go through the JSON-mode constraint.
#[test]
fn ollama_format_constrains_the_reply_to_json() {
    let srv = TestServer::start(cfg(2, 8), None);
    let schema = json!({"type": "object", "properties": {"color": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}}, "required": ["color", "ok"]});
    for seed in 0..2 {
        let r = post(srv.addr, "/api/chat", &json!({"model": "tiny", "stream": false, "format": schema,
            "messages": [{"role": "user", "content": "json please"}], "options": {"temperature": 1.0, "seed": seed, "num_predict": 300}}));
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let content = v["message"]["content"].as_str().unwrap();
        assert_eq!(v["done_reason"], "stop", "{content}");
        let out: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content:?}"));
        assert!(out["color"] == "red" || out["color"] == "green", "{content}");
        assert!(out["ok"].is_boolean(), "{content}");
    }
    // `"json"`: any object. The random model may write one endless string,
    // so only a finished reply must parse; every reply opens an object.
    for seed in 0..3 {
        let v = post(srv.addr, "/api/generate", &json!({"model": "tiny", "stream": false, "format": "json", "prompt": "json please",
            "options": {"temperature": 1.0, "seed": seed, "num_predict": 40}})).json();
        let content = v["response"].as_str().unwrap();
        assert!(content.trim_start().starts_with('{'), "{content:?}");
        if v["done_reason"] == "stop" {
            let out: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content:?}"));
            assert!(out.is_object(), "{content}");
        }
    }
}

/// Errors as ollama answers them: a status and `{"error": "<text>"}`.
#[test]
fn ollama_errors_are_an_error_string_with_a_status() {
    let srv = TestServer::start(cfg(1, 4), None);
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (path, body, status, needle) in [
        ("/api/chat", json!({"messages": msgs}), 400, "model is required"),
        ("/api/generate", json!({"prompt": "hi"}), 400, "model is required"),
        ("/api/embed", json!({"input": "hi"}), 400, "model is required"),
        ("/api/chat", json!({"model": "m", "messages": msgs, "options": {"temperature": "hot"}}), 400, "options.temperature"),
        ("/api/chat", json!({"model": "m", "messages": msgs, "options": {"temperature": 7}}), 400, "temperature"),
        ("/api/generate", json!({"model": "m", "prompt": "hi", "options": {"num_predict": 0}}), 400, "num_predict"),
        ("/api/generate", json!({"model": "m", "prompt": "hi", "format": "xml"}), 400, "invalid format"),
        ("/api/generate", json!({"model": "m", "prompt": "hi", "images": ["AAAA"]}), 400, "images"),
        ("/api/chat", json!({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}), 400, "wizard"),
        ("/api/chat", json!({"model": "m", "messages": msgs, "think": true}), 400, "thinking"),
        ("/api/chat", json!({"model": "m", "messages": msgs, "tools": [{"type": "function"}]}), 400, "tools"),
        ("/api/embed", json!({"model": "m", "input": ["x".repeat(2000)], "truncate": false}), 400, "context length"),
    ] {
        let r = post(srv.addr, path, &body);
        assert_eq!(r.status, status, "{path} {body}: {}", r.body);
        let v = r.json();
        let e = v["error"].as_str().unwrap_or_else(|| panic!("{path} {body}: the error is a string: {v}"));
        assert!(e.contains(needle), "{path} {body}: {e:?} should mention {needle:?}");
    }
    let r = post(srv.addr, "/api/pull", &json!({"model": "llama3"}));
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.json()["error"].as_str().unwrap().contains("/api/pull"), "{}", r.body);
    let r = read_reply(send(srv.addr, "POST", "/api/chat", &[], b""));
    assert_eq!(r.status, 400);
    assert_eq!(r.json(), json!({"error": "missing request body"}));
    let r = read_reply(send(srv.addr, "POST", "/api/chat", &[], b"{nope"));
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].is_string(), "{}", r.body);
}

/// `/api/embed` serves without `--embeddings` (as ollama embeds with any
/// model): unit vectors of the mean-pooled hidden states, in order;
/// `dimensions` cuts and renormalizes; `/api/embeddings` is the older shape.
#[test]
fn ollama_embed_gives_normalized_mean_pooled_vectors_without_the_flag() {
    let srv = TestServer::start(cfg(2, 8), None);
    let texts = ["hello there", "the quick brown fox jumps over the lazy dog"];
    let r = post(srv.addr, "/api/embed", &json!({"model": "tiny", "input": texts}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], "tiny");
    let embs = v["embeddings"].as_array().unwrap();
    assert_eq!(embs.len(), 2);
    let mut n_tokens = 0;
    for (e, text) in embs.iter().zip(texts) {
        let got = floats(e);
        let ids = encode(text, true);
        n_tokens += ids.len();
        let want = embedding_alone(&ids, Pooling::Mean);
        assert_eq!(got.len(), want.len());
        let norm: f32 = got.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{text:?}: |v| = {norm}");
        let c = cosine(&got, &want);
        assert!(c > SAME, "{text:?}: cosine {c}");
    }
    assert_eq!(v["prompt_eval_count"], n_tokens);
    assert!(v["total_duration"].is_u64());
    let one = post(srv.addr, "/api/embed", &json!({"model": "tiny", "input": texts[0], "dimensions": 8})).json();
    let cut = floats(&one["embeddings"][0]);
    assert_eq!(cut.len(), 8);
    let full = floats(&embs[0]);
    let norm: f32 = cut.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "renormalized: |v| = {norm}");
    let c = cosine(&cut, &full[..8]);
    assert!(c > SAME, "the first 8 values: cosine {c}: {cut:?} vs {:?}", &full[..8]);
    let empty = post(srv.addr, "/api/embed", &json!({"model": "tiny", "input": []})).json();
    assert_eq!(empty["embeddings"], json!([]));
    let old = post(srv.addr, "/api/embeddings", &json!({"model": "tiny", "prompt": texts[0]}));
    assert_eq!(old.status, 200, "{}", old.body);
    let c = cosine(&floats(&old.json()["embedding"]), &full);
    assert!(c > SAME, "/api/embeddings: cosine {c}");
}

/// `/api/tags`, `/api/ps`, `/api/show`, `/api/version`: ollama's shapes with
/// this model's facts, read from its file independently here.
#[test]
fn ollama_tags_show_ps_and_version_describe_the_model() {
    let srv = TestServer::start(cfg(1, 4), None);
    let file = ferrox_gguf::GgufFile::open(tiny_path()).unwrap();
    let size = std::fs::metadata(tiny_path()).unwrap().len();
    let tags = get(srv.addr, "/api/tags", &[]);
    assert_eq!(tags.status, 200, "{}", tags.body);
    let t = tags.json();
    let m = &t["models"][0];
    assert_eq!(t["models"].as_array().unwrap().len(), 1);
    assert_eq!(m["name"], "tiny");
    assert_eq!(m["model"], "tiny");
    assert_eq!(m["size"], size);
    assert!(is_rfc3339_utc(m["modified_at"].as_str().unwrap()), "{m}");
    assert_eq!(m["details"]["format"], "gguf");
    assert_eq!(m["details"]["family"], file.get_str("general.architecture").unwrap());
    assert_eq!(m["details"]["families"], json!([file.get_str("general.architecture").unwrap()]));
    let n: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    assert!(m["details"]["parameter_size"].as_str().unwrap().len() > 1, "{m}");
    let ps = get(srv.addr, "/api/ps", &[]).json();
    assert_eq!(ps["models"][0]["name"], "tiny");
    assert!(ps["models"][0]["expires_at"].is_string());
    let show = post(srv.addr, "/api/show", &json!({"model": "tiny"}));
    assert_eq!(show.status, 200, "{}", show.body);
    let s = show.json();
    let model = Model::open(tiny_path(), Cpu::new(1)).unwrap();
    let t = ChatTemplate::from_gguf(model.file().metadata_file()).unwrap();
    assert_eq!(s["template"], t.source());
    assert_eq!(s["details"], m["details"]);
    assert_eq!(s["model_info"]["general.architecture"], file.get_str("general.architecture").unwrap());
    assert_eq!(s["model_info"]["general.parameter_count"], n);
    assert_eq!(s["model_info"]["tokenizer.ggml.tokens"], json!([]), "arrays are empty unless verbose");
    let verbose = post(srv.addr, "/api/show", &json!({"model": "tiny", "verbose": true})).json();
    let n_vocab = file.get_array("tokenizer.ggml.tokens").unwrap().len();
    assert_eq!(verbose["model_info"]["tokenizer.ggml.tokens"].as_array().unwrap().len(), n_vocab);
    assert!(s["capabilities"].as_array().unwrap().contains(&json!("completion")));
    let ver = get(srv.addr, "/api/version", &[]);
    assert_eq!(ver.status, 200);
    assert!(ver.json()["version"].as_str().unwrap().split('.').all(|p| p.parse::<u32>().is_ok()), "{}", ver.body);
    assert_eq!(post(srv.addr, "/api/show", &json!({})).json()["error"], "model is required");
}

/// With `--api-key`, `/api/*` needs it too, and says so in ollama's shape.
#[test]
fn ollama_endpoints_need_the_api_key() {
    let srv = TestServer::start(cfg(1, 4), Some("sekrit"));
    let r = get(srv.addr, "/api/tags", &[]);
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(r.json()["error"].as_str().unwrap().contains("API key"), "{}", r.body);
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": false, "options": {"num_predict": 2}});
    assert_eq!(post(srv.addr, "/api/chat", &body).status, 401);
    let ok = read_reply(send(srv.addr, "POST", "/api/chat", &[("Authorization", "Bearer sekrit")], body.to_string().as_bytes()));
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(get(srv.addr, "/api/tags", &[("Authorization", "Bearer sekrit")]).status, 200);
}

// ---- The chat page at `/`, in a real browser ----

/// The chat page is served without the key, as one self-contained HTML file.
#[test]
fn the_chat_page_is_served_without_the_key_and_loads_nothing_from_elsewhere() {
    let srv = TestServer::start(cfg(1, 4), Some("sekrit"));
    let r = get(srv.addr, "/", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    assert!(r.header("content-security-policy").unwrap().contains("connect-src 'self'"));
    assert!(r.body.contains("/v1/chat/completions"), "the page talks to the chat endpoint");
    for outside in ["http://", "https://", "<script src", "<link ", "@import", "url("] {
        assert!(!r.body.contains(outside), "{outside} in the page: it loads nothing from elsewhere");
    }
    assert_eq!(get(srv.addr, "/v1/models", &[]).status, 401, "the API itself still needs the key");
}

/// A WebDriver session over chromedriver: a few JSON calls over HTTP.
struct Browser {
    driver: std::process::Child,
    port: u16,
    session: String,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    /// chromedriver driving headless Chromium, or why not.
    fn start() -> Result<Browser, String> {
        let driver_bin = ["chromedriver", "/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|b| std::process::Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()))
            .ok_or("chromedriver is not installed (Debian: apt-get install chromium chromium-driver)")?;
        let chromium = ["/usr/bin/chromium", "/usr/lib/chromium/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .ok_or("chromium is not installed (Debian: apt-get install chromium chromium-driver)")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = std::process::Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("{driver_bin} did not start: {e}"))?;
        let mut b = Browser { driver, port, session: String::new() };
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if t0.elapsed() > Duration::from_secs(20) {
                return Err("chromedriver did not listen within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,800"]}}}});
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["sessionId"].as_str().ok_or_else(|| format!("no WebDriver session: {v}"))?.to_string();
        Ok(b)
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let r = read_reply(self.send(method, path, &body));
        let v = r.json();
        assert!(r.status == 200, "WebDriver {method} {path}: {} {}", r.status, r.body);
        v["value"].clone()
    }

    /// chromedriver takes only requests whose Host is localhost.
    fn send(&self, method: &str, path: &str, body: &str) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost:{}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.port,
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        s
    }

    fn s(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    fn find(&self, css: &str) -> String {
        let v = self.call("POST", &self.s("/element"), Some(json!({"using": "css selector", "value": css})));
        v[ELEMENT].as_str().unwrap_or_else(|| panic!("no element {css}: {v}")).to_string()
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.call("POST", &self.s(&format!("/element/{e}/clear")), Some(json!({})));
        self.call("POST", &self.s(&format!("/element/{e}/value")), Some(json!({"text": text})));
    }

    fn click(&self, css: &str) {
        let e = self.find(css);
        self.call("POST", &self.s(&format!("/element/{e}/click")), Some(json!({})));
    }

    fn script(&self, js: &str) -> Value {
        self.call("POST", &self.s("/execute/sync"), Some(json!({"script": js, "args": []})))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = std::panic::catch_unwind(|| read_reply(self.send("DELETE", &path, "")));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Headless Chromium loads the page from a server started with an API key,
/// is given the key and greedy settings, sends a prompt, and the streamed
/// reply in the DOM is the text the API gives for the same request; the
/// page's markdown renderer escapes HTML. A screenshot is kept under the
/// target directory.
#[test]
fn the_chat_page_streams_a_reply_in_headless_chromium() {
    let browser = match Browser::start() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("SKIPPED the_chat_page_streams_a_reply_in_headless_chromium: {why}. NOT CHECKED: the chat page in a real browser (streaming into the DOM, the API key field, the markdown renderer).");
            return;
        }
    };
    let srv = TestServer::start(cfg(2, 8), Some("sekrit"));
    let want = read_reply(send(srv.addr, "POST", "/v1/chat/completions", &[("Content-Type", "application/json"), ("Authorization", "Bearer sekrit")],
        json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}], "temperature": 0, "max_tokens": 12}).to_string().as_bytes())).json();
    let want = want["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    browser.call("POST", &browser.s("/url"), Some(json!({"url": format!("http://{}/", srv.addr)})));
    assert_eq!(browser.script("return document.title"), "ferrox");
    browser.type_into("#apikey", "sekrit");
    browser.type_into("#system", "be brief");
    browser.type_into("#temperature", "0");
    browser.type_into("#max_tokens", "12");
    browser.type_into("#prompt", "hello there");
    browser.click("#send");
    let t0 = Instant::now();
    let state = loop {
        let s = browser.script("const m = document.querySelector('#messages .msg.assistant, #messages .msg.error'); return m ? [m.dataset.state, m.dataset.raw || '', m.dataset.chunks || '0', m.textContent] : null");
        if s[0] != "streaming" && !s.is_null() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no reply within 60 s: {s}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let shot = browser.call("GET", &browser.s("/screenshot"), None);
    let png = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.decode(shot.as_str().unwrap()).unwrap()
    };
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chat-page.png");
    std::fs::write(&path, &png).unwrap();
    eprintln!("chat page screenshot (CI artifact): {}", path.display());
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    assert_eq!(state[0], "done", "the reply finished: {state}");
    assert_eq!(state[1], want.as_str(), "the streamed reply in the DOM is the API's text");
    assert!(state[2].as_str().unwrap().parse::<u32>().unwrap() > 1, "the reply came in several chunks: {state}");
    assert!(!state[3].as_str().unwrap().is_empty());

    // The renderer: markdown to tags, any HTML in the text escaped.
    let html = browser.script(r#"return renderMarkdown("**bold** and `<b>code</b>`\n\n```rust\nlet x = 1 < 2;\n```\n- <img src=x onerror=alert(1)>\n[ok](https://example.com) [bad](javascript:alert(1))")"#);
    let html = html.as_str().unwrap();
    for want in ["<strong>bold</strong>", "<code>&lt;b&gt;code&lt;/b&gt;</code>", "<pre><code class=\"language-rust\">let x = 1 &lt; 2;</code></pre>",
                 "<li>&lt;img src=x onerror=alert(1)&gt;</li>", "<a href=\"https://example.com\""] {
        assert!(html.contains(want), "{want} in {html}");
    }
    assert!(!html.contains("<img") && !html.contains("href=\"javascript"), "{html}");

    // Stop, deterministically: a reply that never ends (fetch replaced by
    // a stream that sends one chunk and then waits) is cut by the button,
    // keeping the text so far.
    browser.script(r#"window.realFetch = window.fetch; window.fetch = (url, opts) => Promise.resolve(new Response(new ReadableStream({start(c) {
        c.enqueue(new TextEncoder().encode('data: {"choices":[{"index":0,"delta":{"content":"partial"},"finish_reason":null}]}\n\n'));
        opts.signal.addEventListener('abort', () => c.error(new DOMException('aborted', 'AbortError')));
    }}), {status: 200, headers: {'Content-Type': 'text/event-stream'}})); return true"#);
    browser.type_into("#prompt", "never ending");
    browser.click("#send");
    let t0 = Instant::now();
    while browser.script("const m = document.querySelectorAll('#messages .msg.assistant'); return m.length == 2 && m[1].dataset.raw == 'partial'") != true {
        assert!(t0.elapsed() < Duration::from_secs(20), "the first chunk of the endless reply never showed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(browser.script("return document.getElementById('send').disabled"), true, "send is disabled while a reply streams");
    browser.click("#stop");
    let t0 = Instant::now();
    loop {
        let s = browser.script("const m = document.querySelectorAll('#messages .msg.assistant')[1]; return [m.dataset.state, m.dataset.raw, document.getElementById('send').disabled]");
        if s[0] != "streaming" {
            assert_eq!(s, json!(["stopped", "partial", false]), "Stop ends the reply, keeps its text and gives Send back");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "Stop did not end the reply: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
    browser.script("window.fetch = window.realFetch; return true");
    // New chat: the transcript and the conversation sent are emptied (the
    // tiny model's 256-token context would not hold another turn).
    browser.click("#clear");
    assert_eq!(browser.script("return document.querySelectorAll('#messages .msg').length"), 0);

    // A real turn after it, then Stop: the send button comes back and the
    // turn ends stopped or done (the tiny model may finish first).
    browser.type_into("#max_tokens", "200");
    browser.type_into("#prompt", "and again");
    browser.click("#send");
    browser.click("#stop");
    let t0 = Instant::now();
    loop {
        let s = browser.script("const m = document.querySelectorAll('#messages .msg.assistant'); return [m.length, m[m.length - 1].dataset.state, document.getElementById('send').disabled]");
        if s[1] != "streaming" {
            assert_eq!(s[0], 1, "{s}: {}", browser.script("return document.getElementById('messages').innerText"));
            assert!(s[1] == "stopped" || s[1] == "done", "{s}");
            assert_eq!(s[2], false, "send is enabled again: {s}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the second turn did not end: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `anyOf`, `oneOf`, `$ref`/`$defs`, `pattern`, string lengths, numeric
/// bounds and `additionalProperties: false` all hold in sampled output
/// (the tiny model's weights are random: only the mask makes it valid).
#[test]
fn full_json_schema_output_follows_anyof_ref_pattern_and_bounds() {
    let srv = TestServer::start(cfg(2, 8), None);
    let schema = json!({
        "type": "object",
        "$defs": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
        "properties": {
            "id": {"$ref": "#/$defs/code"},
            "value": {"anyOf": [
                {"type": "integer", "minimum": 10, "maximum": 99},
                {"type": "string", "minLength": 2, "maxLength": 4, "pattern": "^[a-z]+$"}
            ]},
            "kind": {"oneOf": [{"const": "a"}, {"const": "b"}]}
        },
        "required": ["id", "value", "kind"],
        "additionalProperties": false
    });
    let mut seen_int = false;
    let mut seen_str = false;
    for seed in 0..6 {
        let body = json!({"messages": [{"role": "user", "content": "json please"}], "temperature": 1.0, "seed": seed, "max_tokens": 120,
                          "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}});
        let v = post(srv.addr, "/v1/chat/completions", &body).json();
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{content}");
        let out: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content:?}"));
        let o = out.as_object().unwrap();
        let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["id", "kind", "value"], "{content}");
        let id: Vec<char> = out["id"].as_str().unwrap().chars().collect();
        assert!(
            id.len() == 6
                && id[..2].iter().all(char::is_ascii_uppercase)
                && id[2] == '-'
                && id[3..].iter().all(char::is_ascii_digit),
            "{content}"
        );
        match &out["value"] {
            Value::Number(n) => {
                seen_int = true;
                let n = n.as_i64().unwrap_or_else(|| panic!("an integer: {content}"));
                assert!((10..=99).contains(&n), "{content}");
            }
            Value::String(s) => {
                seen_str = true;
                assert!((2..=4).contains(&s.len()) && s.chars().all(|c| c.is_ascii_lowercase()), "{content}");
            }
            other => panic!("value {other}: {content}"),
        }
        assert!(out["kind"] == "a" || out["kind"] == "b", "{content}");
    }
    assert!(seen_int || seen_str);
}

/// llama.cpp's `grammar` (GBNF) and a `regex` shape the output exactly.
#[test]
fn gbnf_grammar_and_regex_shape_the_output() {
    let srv = TestServer::start(cfg(2, 8), None);
    let grammar = "root ::= \"answer: \" item (\", \" item){1,3}\nitem ::= [a-c] [0-9]\n";
    for seed in 0..4 {
        let body = json!({"messages": [{"role": "user", "content": "answer"}], "temperature": 1.0, "seed": seed, "max_tokens": 60, "grammar": grammar});
        let v = post(srv.addr, "/v1/chat/completions", &body).json();
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{content}");
        let items = content.strip_prefix("answer: ").unwrap_or_else(|| panic!("{content:?}"));
        let items: Vec<&str> = items.split(", ").collect();
        assert!((2..=4).contains(&items.len()), "{content:?}");
        for it in items {
            let b = it.as_bytes();
            assert!(b.len() == 2 && (b'a'..=b'c').contains(&b[0]) && b[1].is_ascii_digit(), "{content:?}");
        }
    }
    for seed in 0..3 {
        let body = json!({"prompt": "code:", "temperature": 1.0, "seed": seed, "max_tokens": 30, "regex": "[0-9]{3}-[xyz]{2}"});
        let v = post(srv.addr, "/v1/completions", &body).json();
        let text = v["choices"][0]["text"].as_str().unwrap();
        let b = text.as_bytes();
        assert!(
            b.len() == 6 && b[..3].iter().all(u8::is_ascii_digit) && b[3] == b'-' && b[4..].iter().all(|c| b"xyz".contains(c)),
            "{text:?}"
        );
    }
}

/// What the engine cannot enforce is refused, naming the field and the keyword.
#[test]
fn unenforceable_constraints_are_400s_naming_the_field() {
    let srv = TestServer::start(cfg(1, 4), None);
    let msgs = json!([{"role": "user", "content": "x"}]);
    for (body, param, words) in [
        (json!({"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}}}}), "response_format", "not"),
        (json!({"messages": msgs, "json_schema": {"type": "string", "dependentSchemas": {}}}), "json_schema", "dependentSchemas"),
        (json!({"messages": msgs, "grammar": "root ::= missing-rule"}), "grammar", "missing"),
        (json!({"messages": msgs, "grammar": "root ::= [z-a]"}), "grammar", "reversed"),
        (json!({"messages": msgs, "regex": "(unclosed"}), "regex", "regex"),
        (json!({"messages": msgs, "grammar": "root ::= \"x\"", "regex": "y"}), "regex", "one output constraint"),
    ] {
        let r = post(srv.addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let v = r.json();
        assert_eq!(v["error"]["param"], param, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(words), "{msg:?} names {words:?}");
    }
}

/// The tools' description makes long prompts in the tiny model's vocabulary.
fn tool_cfg() -> SchedulerConfig {
    SchedulerConfig { n_ctx: 2048, ..cfg(2, 8) }
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "weather for a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "unit"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"]}}}
    ])
}

/// Checks one call's arguments against its function's schema by hand.
fn assert_valid_call(call: &Value, ctx: &str) {
    assert_eq!(call["type"], "function", "{ctx}");
    assert!(call["id"].as_str().is_some_and(|s| !s.is_empty()), "{ctx}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("arguments not JSON ({e}): {ctx}"));
    let o = args.as_object().unwrap_or_else(|| panic!("arguments an object: {ctx}"));
    match call["function"]["name"].as_str().unwrap() {
        "get_weather" => {
            assert!(o.keys().all(|k| ["city", "unit", "days"].contains(&k.as_str())), "{ctx}");
            assert!(o["city"].as_str().is_some_and(|c| c.chars().count() <= 12), "{ctx}");
            assert!(o["unit"] == "c" || o["unit"] == "f", "{ctx}");
            if let Some(d) = o.get("days") {
                assert!(d.as_i64().is_some_and(|d| (1..=7).contains(&d)), "{ctx}");
            }
        }
        "get_time" => {
            assert!(o.keys().all(|k| k == "zone"), "{ctx}");
            assert!(o["zone"].as_str().is_some_and(|z| z.chars().count() <= 8), "{ctx}");
        }
        other => panic!("unknown function {other}: {ctx}"),
    }
}

/// `tool_choice: "required"` makes even random weights produce calls whose
/// arguments follow the function's schema; a named function is the one
/// called; `parallel_tool_calls: false` gives one call.
#[test]
fn required_and_named_tool_choice_yield_schema_valid_calls() {
    let srv = TestServer::start(tool_cfg(), None);
    for (seed, choice, parallel) in [
        (0, json!("required"), true),
        (1, json!("required"), false),
        (2, json!("required"), true),
        (3, json!({"type": "function", "function": {"name": "get_time"}}), true),
        (4, json!({"type": "function", "function": {"name": "get_weather"}}), false),
    ] {
        let body = json!({"messages": [{"role": "user", "content": "weather in Oslo?"}], "temperature": 1.0, "seed": seed, "max_tokens": 600,
                          "tools": weather_tools(), "tool_choice": choice, "parallel_tool_calls": parallel});
        let v = post(srv.addr, "/v1/chat/completions", &body).json();
        let ctx = v.to_string();
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{ctx}");
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("{ctx}"));
        assert!(!calls.is_empty(), "{ctx}");
        if !parallel {
            assert_eq!(calls.len(), 1, "{ctx}");
        }
        for c in calls {
            assert_valid_call(c, &ctx);
            if let Some(name) = choice["function"]["name"].as_str() {
                assert_eq!(c["function"]["name"], name, "{ctx}");
            }
        }
    }
}

/// Streamed, a forced call arrives as `tool_calls` deltas and the
/// `tool_calls` finish reason; a conversation with an assistant call and
/// its `tool` result renders.
#[test]
fn streamed_tool_calls_and_tool_turns() {
    let srv = TestServer::start(tool_cfg(), None);
    let body = json!({"messages": [{"role": "user", "content": "weather?"}], "temperature": 1.0, "seed": 7, "max_tokens": 600,
                      "tools": weather_tools(), "tool_choice": "required", "stream": true});
    let r = post(srv.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let mut calls = Vec::new();
    let mut finish = Value::Null;
    for e in sse_events(&r.body) {
        if e == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&e).unwrap();
        let ch = &v["choices"][0];
        if let Some(tc) = ch["delta"]["tool_calls"].as_array() {
            calls.extend(tc.iter().cloned());
        }
        if !ch["finish_reason"].is_null() {
            finish = ch["finish_reason"].clone();
        }
    }
    assert_eq!(finish, "tool_calls", "{}", r.body);
    assert!(!calls.is_empty(), "{}", r.body);
    for (k, c) in calls.iter().enumerate() {
        assert_eq!(c["index"], k, "{}", r.body);
        assert_valid_call(c, &r.body);
    }
    let convo = json!({"messages": [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"c\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "-3 and snowing"}],
        "tools": weather_tools(), "tool_choice": "none", "max_tokens": 2, "temperature": 0});
    let v = post(srv.addr, "/v1/chat/completions", &convo).json();
    assert!(v["choices"][0]["message"].get("tool_calls").is_none(), "tool_choice none: {v}");
    // The tiny model's template (Gemma's) knows no tools: the call and the
    // result are rendered as text of alternating turns.
    let p = post(srv.addr, "/apply-template", &convo).json();
    let prompt = p["prompt"].as_str().unwrap_or_else(|| panic!("{p}"));
    assert!(prompt.contains("-3 and snowing") && prompt.contains("\"tool_response\""), "{prompt}");
    assert!(prompt.contains("\"name\":\"get_weather\""), "{prompt}");
}

/// Bad tool requests are 400s naming the field.
#[test]
fn bad_tool_requests_are_400s_naming_the_field() {
    let srv = TestServer::start(cfg(1, 4), None);
    let msgs = json!([{"role": "user", "content": "x"}]);
    for (body, param) in [
        (json!({"messages": msgs, "tools": weather_tools(), "tool_choice": "always"}), "tool_choice"),
        (json!({"messages": msgs, "tools": weather_tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}), "tool_choice"),
        (json!({"messages": msgs, "tool_choice": "required"}), "tool_choice"),
        (json!({"messages": msgs, "tools": [{"type": "retrieval"}]}), "tools[0]"),
        (json!({"messages": msgs, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"not": {}}}}}}], "tool_choice": "required"}), "tool_choice"),
        (json!({"messages": msgs, "tools": weather_tools(), "tool_choice": "required", "response_format": {"type": "json_object"}}), "tool_choice"),
    ] {
        let r = post(srv.addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{body}: {}", r.body);
    }
}

/// `text` as a regular expression matching only itself.
fn regex_literal(text: &str) -> String {
    let mut r = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            r.push('\\');
        }
        r.push(c);
    }
    r
}

/// Reads a streamed chat reply: its `reasoning_content` and `content`
/// deltas joined, its tool-call deltas, and its finish reason.
fn read_stream(body: &str) -> (String, String, Vec<Value>, Value) {
    let (mut reasoning, mut content, mut calls, mut finish) = (String::new(), String::new(), Vec::new(), Value::Null);
    for e in sse_events(body) {
        if e == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&e).unwrap();
        let ch = &v["choices"][0];
        reasoning.push_str(ch["delta"]["reasoning_content"].as_str().unwrap_or_default());
        content.push_str(ch["delta"]["content"].as_str().unwrap_or_default());
        if let Some(tc) = ch["delta"]["tool_calls"].as_array() {
            calls.extend(tc.iter().cloned());
        }
        if !ch["finish_reason"].is_null() {
            finish = ch["finish_reason"].clone();
        }
    }
    (reasoning, content, calls, finish)
}

/// gpt-oss replies in harmony channels: the analysis channel comes back as
/// `reasoning_content`, the final channel as `content`, whole and streamed
/// (the tiny model is made to write a harmony reply by a `regex`).
#[test]
fn harmony_channels_become_reasoning_content_and_content() {
    let srv = TestServer::start_harmony(tool_cfg());
    let reply = "<|channel|>analysis<|message|>Two and two: 4.<|end|><|start|>assistant<|channel|>final<|message|>It is <b>4</b>.";
    let body = json!({"messages": [{"role": "user", "content": "2+2?"}], "temperature": 0, "max_tokens": 400, "regex": regex_literal(reply)});
    let v = post(srv.addr, "/v1/chat/completions", &body).json();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "Two and two: 4.", "{v}");
    assert_eq!(m["content"], "It is <b>4</b>.", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let r = post(srv.addr, "/v1/chat/completions", &sbody);
    assert_eq!(r.status, 200, "{}", r.body);
    let (reasoning, content, calls, finish) = read_stream(&r.body);
    assert_eq!((reasoning.as_str(), content.as_str(), calls.len()), ("Two and two: 4.", "It is <b>4</b>.", 0), "{}", r.body);
    assert_eq!(finish, "stop");
    // The reasoning arrives in several deltas, before the final channel.
    let deltas: Vec<Value> = sse_events(&r.body)
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["delta"].clone())
        .collect();
    let has = |d: &Value, k: &str| d[k].as_str().is_some_and(|t| !t.is_empty());
    let first_content = deltas.iter().position(|d| has(d, "content")).unwrap();
    let last_reasoning = deltas.iter().rposition(|d| has(d, "reasoning_content")).unwrap();
    let n_reasoning = deltas.iter().filter(|d| has(d, "reasoning_content")).count();
    assert!(n_reasoning > 1 && last_reasoning < first_content, "{}", r.body);
}

/// A harmony call (`to=functions.NAME` on the commentary channel) becomes
/// `tool_calls` when the tool was offered, whole and streamed; without
/// `tools` it is dropped, as llama.cpp drops calls to tools it was not
/// given.
#[test]
fn harmony_calls_become_tool_calls() {
    let srv = TestServer::start_harmony(tool_cfg());
    let reply = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\",\"unit\":\"c\"}";
    let body = json!({"messages": [{"role": "user", "content": "weather in Oslo?"}], "temperature": 0, "max_tokens": 400,
                      "tools": weather_tools(), "regex": regex_literal(reply)});
    let v = post(srv.addr, "/v1/chat/completions", &body).json();
    let m = &v["choices"][0]["message"];
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    assert_eq!(m["reasoning_content"], "Need weather.", "{v}");
    assert!(m["content"].is_null(), "{v}");
    assert_eq!(m["tool_calls"][0]["function"]["name"], "get_weather", "{v}");
    assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Oslo\",\"unit\":\"c\"}", "{v}");
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let r = post(srv.addr, "/v1/chat/completions", &sbody);
    let (reasoning, content, calls, finish) = read_stream(&r.body);
    assert_eq!((reasoning.as_str(), content.as_str(), finish), ("Need weather.", "", json!("tool_calls")), "{}", r.body);
    assert_eq!(calls.len(), 1, "{}", r.body);
    assert_eq!((&calls[0]["index"], &calls[0]["function"]["name"]), (&json!(0), &json!("get_weather")), "{}", r.body);
    let mut no_tools = body.clone();
    no_tools.as_object_mut().unwrap().remove("tools");
    let v = post(srv.addr, "/v1/chat/completions", &no_tools).json();
    let m = &v["choices"][0]["message"];
    assert_eq!((&m["reasoning_content"], &m["content"], v["choices"][0]["finish_reason"].as_str()), (&json!("Need weather."), &json!(""), Some("stop")), "{v}");
    assert!(m.get("tool_calls").is_none(), "{v}");
}

/// `tool_choice: "required"` under harmony: the grammar writes the call's
/// header and the arguments follow the schema, even from random weights;
/// and a conversation carrying the call, its reasoning and its result
/// renders through gpt-oss's template (reasoning as `thinking`).
#[test]
fn harmony_forced_calls_follow_the_schema_and_reasoning_renders_back() {
    let srv = TestServer::start_harmony(tool_cfg());
    for (seed, choice) in [(0, json!("required")), (1, json!({"type": "function", "function": {"name": "get_time"}}))] {
        let body = json!({"messages": [{"role": "user", "content": "weather in Oslo?"}], "temperature": 1.0, "seed": seed, "max_tokens": 600,
                          "tools": weather_tools(), "tool_choice": choice});
        let v = post(srv.addr, "/v1/chat/completions", &body).json();
        let ctx = v.to_string();
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{ctx}");
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("{ctx}"));
        assert_eq!(calls.len(), 1, "{ctx}");
        assert_valid_call(&calls[0], &ctx);
        if let Some(name) = choice["function"]["name"].as_str() {
            assert_eq!(calls[0]["function"]["name"], name, "{ctx}");
        }
    }
    let convo = json!({"messages": [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "reasoning_content": "Call the tool.", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"c\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "-3 and snowing"}],
        "tools": weather_tools()});
    let p = post(srv.addr, "/apply-template", &convo).json();
    let prompt = p["prompt"].as_str().unwrap_or_else(|| panic!("{p}"));
    assert!(prompt.contains("<|start|>assistant<|channel|>analysis<|message|>Call the tool.<|end|>"), "{prompt}");
    assert!(prompt.contains("to=functions.get_weather"), "{prompt}");
    assert!(prompt.ends_with("<|start|>assistant"), "{prompt}");
}

/// Under harmony a `response_format` reply is the final channel's message:
/// the grammar writes `<|channel|>final<|message|>` and then the JSON, which
/// comes back as `content`.
#[test]
fn harmony_json_replies_are_the_final_channel() {
    let srv = TestServer::start_harmony(tool_cfg());
    let schema = json!({"type": "object", "properties": {"color": {"enum": ["red", "green"]}}, "required": ["color"]});
    for seed in 0..2 {
        let body = json!({"messages": [{"role": "user", "content": "json please"}], "temperature": 1.0, "seed": seed, "max_tokens": 300, "logprobs": true,
                          "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}});
        let v = post(srv.addr, "/v1/chat/completions", &body).json();
        let ctx = v.to_string();
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{ctx}");
        let raw: String = v["choices"][0]["logprobs"]["content"].as_array().unwrap().iter().map(|t| t["token"].as_str().unwrap()).collect();
        assert!(raw.starts_with("<|channel|>final<|message|>{"), "{raw:?}");
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        let out: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {ctx}"));
        assert!(out["color"] == "red" || out["color"] == "green", "{ctx}");
    }
}

/// Ollama's `/api/chat` with a harmony model takes `think` (gpt-oss always
/// thinks) where the tiny Gemma server refuses it.
#[test]
fn ollama_chat_takes_think_under_harmony() {
    let srv = TestServer::start_harmony(tool_cfg());
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "think": "high", "stream": false, "options": {"num_predict": 4, "temperature": 0}});
    let r = post(srv.addr, "/api/chat", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["message"]["content"].is_string(), "{}", r.body);
}

/// A repeated prompt reuses the slot's cached prefix unless the request
/// says `cache_prompt: false` (llama-server's field): then the whole prompt
/// is evaluated again and the usage reports nothing cached.
#[test]
fn cache_prompt_false_evaluates_the_whole_prompt() {
    let srv = TestServer::start(cfg(1, 4), None);
    let cached = |body: &Value| -> u64 {
        let r = post(srv.addr, "/v1/chat/completions", body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let mut body = greedy_chat(4);
    assert_eq!(cached(&body), 0, "a fresh slot has nothing cached");
    assert!(cached(&body) > 0, "the same prompt again reuses its prefix");
    body["cache_prompt"] = json!(false);
    assert_eq!(cached(&body), 0, "cache_prompt false still reused the prefix");
    body["cache_prompt"] = json!("no");
    let r = post(srv.addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 400, "{}", r.body);
}
