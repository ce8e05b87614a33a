//! Tests of the native half of `snakecage.tools`: checks, calls in flight up to the cap,
//! and the end of a job.

use super::*;
use snakecage_worker::protocol::{ToolCall, WorkerMessage};
use std::os::unix::net::UnixStream;

#[test]
fn violations_name_the_argument() {
    assert_eq!(
        describe_violation("/city", "3 is not of type \"string\""),
        "city: 3 is not of type \"string\""
    );
    assert_eq!(describe_violation("", "x"), "x");
    assert_eq!(describe_violation("/a/0", "m"), "a.0: m");
}

pub(super) fn weather() -> ToolSpec {
    ToolSpec {
        name: "weather".into(),
        description: "d".into(),
        parameters: serde_json::json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"]
        }),
    }
}

/// Tools over a socket pair of their own, and the supervisor's end.
pub(super) fn tools() -> (&'static Tools, UnixStream) {
    let (socket, supervisor) = crate::jobsocket::tests::pair();
    (Box::leak(Box::new(Tools::new(socket))), supervisor)
}

fn call(tools: &'static Tools, city: &str) -> std::thread::JoinHandle<Answer> {
    let arguments = serde_json::json!({ "city": city }).to_string();
    std::thread::spawn(move || {
        let checked = tools.check("weather", &arguments).unwrap();
        tools.send(checked, None).unwrap()
    })
}

/// The next frame the worker sent.
pub(super) fn sent(supervisor: &mut UnixStream) -> WorkerMessage {
    frame::read_frame(supervisor, frame::MAX_FRAME_LEN)
        .unwrap()
        .unwrap()
}

pub(super) fn sent_call(supervisor: &mut UnixStream) -> ToolCall {
    match sent(supervisor) {
        WorkerMessage::ToolCall(call) => call,
        other => panic!("not a call: {other:?}"),
    }
}

pub(super) fn wait_until(what: impl Fn() -> bool) {
    while !what() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn unknown_tools_and_bad_arguments_are_refused_before_sending() {
    let (tools, _supervisor) = tools();
    tools.offer(&[weather()], 4);
    let Err(ToolOutcome::Error { kind, message, .. }) = tools.check("nope", "{}") else {
        panic!("an unknown tool went through")
    };
    assert_eq!(kind, ToolErrorKind::UnknownTool);
    assert!(message.contains("weather"), "{message}");
    let Err(ToolOutcome::Error { kind, message, .. }) = tools.check("weather", r#"{"city": 3}"#)
    else {
        panic!("bad arguments went through")
    };
    assert_eq!(kind, ToolErrorKind::InvalidArguments);
    assert!(message.contains("city: 3 is not of type"), "{message}");
    let first = tools.check("weather", r#"{"city": "Zürich"}"#).unwrap();
    // Another thread sees the same tools (a program's threads fan calls out).
    let second = std::thread::spawn(|| tools.check("weather", r#"{"city": "Bern"}"#))
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(second.job, first.job);
    // Once the job ends, no thread may call them.
    tools.withdraw();
    let Err(ToolOutcome::Error { kind, message, .. }) =
        std::thread::spawn(|| tools.check("weather", r#"{"city": "Chur"}"#))
            .join()
            .unwrap()
    else {
        panic!("a withdrawn tool went through")
    };
    assert_eq!(kind, ToolErrorKind::UnknownTool);
    assert!(message.contains("this run has no tools"), "{message}");
    // A call checked before the end is not sent after it.
    assert_eq!(tools.send(first, None).unwrap(), run_ended());
}

/// Arguments nested up to the limit go out; one level more is refused unsent, naming the
/// argument, its depth and the limit, however deep it is (deeper than serde_json parses
/// too).
#[test]
fn arguments_nested_past_the_depth_limit_are_refused_before_sending() {
    let (tools, mut supervisor) = tools();
    let any = ToolSpec {
        name: "echo".into(),
        description: "d".into(),
        parameters: serde_json::json!({"type": "object"}),
    };
    tools.offer(&[any], 1);
    let nested = |levels: usize| format!("{}0{}", "[".repeat(levels), "]".repeat(levels));
    for levels in [MAX_TOOL_JSON_DEPTH + 1, 126, 100_000] {
        let arguments = format!(r#"{{"flat": 1, "tief\"": {}}}"#, nested(levels));
        let Err(ToolOutcome::Error { kind, message, .. }) = tools.check("echo", &arguments) else {
            panic!("{levels} levels went through")
        };
        assert_eq!(kind, ToolErrorKind::Limit);
        assert!(
            message.starts_with(&format!(
                "argument 'tief\"' of tool 'echo' is nested {levels} levels deep, deeper than \
                 the 64 levels"
            )),
            "{message}"
        );
    }
    let deepest = format!(r#"{{"v": {}}}"#, nested(MAX_TOOL_JSON_DEPTH));
    let checked = tools.check("echo", &deepest).unwrap();
    let sender = std::thread::spawn(move || tools.send(checked, None).unwrap());
    let call = sent_call(&mut supervisor);
    assert_eq!(
        jsondepth::value_depth(&call.arguments["v"]),
        MAX_TOOL_JSON_DEPTH
    );
    // The answer as deep as the argument is read back.
    crate::jobsocket::tests::answer(&mut supervisor, call.id, call.arguments.clone());
    assert_eq!(
        sender.join().unwrap(),
        ToolOutcome::Ok {
            result: call.arguments
        }
    );
}

#[test]
fn calls_fly_together_up_to_the_cap_and_each_gets_its_own_answer() {
    let (tools, mut supervisor) = tools();
    tools.offer(&[weather()], 2);
    let cities = ["Zürich", "Genève", "東京"];
    let threads: Vec<_> = cities.iter().map(|c| call(tools, c)).collect();
    // Two go out; the third waits for a slot.
    let mut calls = vec![sent_call(&mut supervisor), sent_call(&mut supervisor)];
    wait_until(|| tools.state().waiting_for_slot == 1);
    assert_eq!(tools.socket.waiting_count(), 2);
    // Answering one (the later one first) lets the third out.
    let answer = |supervisor: &mut UnixStream, call: &ToolCall| {
        crate::jobsocket::tests::answer(supervisor, call.id, call.arguments["city"].clone())
    };
    answer(&mut supervisor, &calls[1]);
    calls.push(sent_call(&mut supervisor));
    answer(&mut supervisor, &calls[2]);
    answer(&mut supervisor, &calls[0]);
    for (thread, city) in threads.into_iter().zip(cities) {
        assert_eq!(
            thread.join().unwrap(),
            ToolOutcome::Ok {
                result: city.into()
            }
        );
    }
    let mut ids: Vec<u64> = calls.iter().map(|c| c.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "{calls:?}");
    assert_eq!(tools.state().in_flight, 0);
}

#[test]
fn the_end_of_a_job_cancels_its_calls_and_no_call_follows_its_result() {
    let (tools, mut supervisor) = tools();
    tools.offer(&[weather()], 1);
    // One call goes out, the other waits for the slot (whichever came first).
    let threads = [call(tools, "Bern"), call(tools, "Sion")];
    let pending = sent_call(&mut supervisor);
    wait_until(|| tools.state().waiting_for_slot == 1);
    // The job loop: withdraw, then the result.
    tools.withdraw();
    tools.socket.send(&WorkerMessage::ResetDone).unwrap();
    assert!(matches!(sent(&mut supervisor), WorkerMessage::ResetDone));
    // The supervisor cancels what it still has pending; that answer is discarded
    // (the thread reading wakes up and finds its own wait over).
    crate::jobsocket::tests::answer(&mut supervisor, pending.id, "late".into());
    for thread in threads {
        assert_eq!(thread.join().unwrap(), run_ended());
    }
    // The next job's call gets its own answer, not a stale one.
    tools.offer(&[weather()], 1);
    let next = call(tools, "Chur");
    let call = sent_call(&mut supervisor);
    assert!(call.id > pending.id);
    crate::jobsocket::tests::answer(&mut supervisor, call.id, "frisch".into());
    assert_eq!(
        next.join().unwrap(),
        ToolOutcome::Ok {
            result: "frisch".into()
        }
    );
}
