//! `ferrox chat` end to end on a tiny model, its input piped: the slash
//! commands, multi-line messages, saving and loading a conversation, and a
//! full context dropping the oldest turns instead of failing. (Line editing
//! and history need a terminal; they are rustyline's, not tested here.)

mod common;
use common::*;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use ferrox_core::arch::Arch;

fn tiny_chat_model() -> PathBuf {
    let path = scratch("chat-qwen3.gguf");
    if !path.exists() {
        // Written aside and renamed: the tests run in parallel.
        let tmp = scratch(&format!("chat-qwen3.{:?}.tmp", std::thread::current().id()));
        ferrox_core::testing::tiny_arch_model(Arch::Qwen3, 5).unwrap().write_to(&tmp).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

fn chat(flags: &[&str], input: &str) -> Output {
    let model = tiny_chat_model();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferrox"))
        .args(["chat", model.to_str().unwrap(), "--temp", "0", "-n", "4", "-v"])
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), input.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    o
}

/// The prompt sizes of the turns the model answered.
fn turns(o: &Output) -> Vec<usize> {
    text(&o.stderr)
        .lines()
        .filter_map(|l| l.strip_prefix("ferrox: turn: prompt "))
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect()
}

fn saved(path: &std::path::Path) -> Vec<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_string(), m["content"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn slash_commands_are_answered_by_chat_and_never_sent_to_the_model() {
    let file = scratch("chat-saved.json");
    let f = file.to_str().unwrap();
    let input = format!("/help\n/foo\nthe of\n/save {f}\n/clear\nto in\n/load {f}\nand is\n/exit\nnever read\n");
    let o = chat(&[], &input);
    let e = text(&o.stderr);
    assert!(e.contains("/save FILE") && e.contains("/load FILE"), "/help lists the commands: {e}");
    assert!(e.contains("unknown command /foo"), "{e}");
    assert!(!e.contains("Some("), "a Debug print: {e}");
    assert!(e.contains("warning: the model file has no chat template"), "{e}");
    let t = turns(&o);
    assert_eq!(t.len(), 3, "three messages, three replies; the commands and the line after /exit none: {e}");
    // /clear forgot the first turn; /load brought it back under the third.
    assert!(t[1] < t[2], "the loaded conversation carries the first turn: {t:?}");
    let s = saved(&file);
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!(s[0], ("user".to_string(), "the of".to_string()));
    assert_eq!(s[1].0, "assistant");
    let o = chat(&[], "/load /nonexistent/conversation.json\nthe of\n");
    assert!(text(&o.stderr).contains("cannot read /nonexistent/conversation.json"), "{}", text(&o.stderr));
    assert_eq!(turns(&o).len(), 1, "a failed /load is a message, not the end of the chat");
}

#[test]
fn a_message_may_span_lines_in_a_triple_quote_block_or_with_a_backslash() {
    let file = scratch("chat-multiline.json");
    let input = format!("\"\"\"\nthe of\nand to\n\"\"\"\nin is \\\nthe of\n/save {}\n", file.to_str().unwrap());
    let o = chat(&[], &input);
    assert_eq!(turns(&o).len(), 2, "two messages, two replies: {}", text(&o.stderr));
    let s = saved(&file);
    assert_eq!(s[0].1, "the of\nand to");
    assert_eq!(s[2].1, "in is \nthe of");
}

#[test]
fn a_full_context_drops_the_oldest_turns_and_keeps_the_system_message() {
    let file = scratch("chat-full.json");
    let mut input = "the of and to in is\n".repeat(10);
    input.push_str(&format!("/save {}\n", file.to_str().unwrap()));
    let o = chat(&["-c", "256", "--system", "be brief"], &input);
    let e = text(&o.stderr);
    assert_eq!(turns(&o).len(), 10, "every message answered: {e}");
    assert!(e.contains("is full: dropped the oldest"), "{e}");
    assert!(!e.contains("error"), "{e}");
    let s = saved(&file);
    assert_eq!(s[0], ("system".to_string(), "be brief".to_string()), "the system message stays");
    assert!(s.len() < 21, "old turns were dropped: {} messages", s.len());
    assert!(turns(&o).iter().all(|&n| n <= 256), "{:?}", turns(&o));
}
