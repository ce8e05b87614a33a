//! The tool calls of a replay session's runs: while a run executes, a [`Recorder`] wrapped
//! around its tools notes each call and the answer the worker got; when the run is
//! replayed, a [`Replayer`] answers the same calls from that record. Tools are never
//! called again by a replay: a tool may have side effects (a mail sent, a card charged),
//! and a caller tool's client belonged to a request that is long over.
//!
//! Choices:
//! - A replayed call is matched by tool name and arguments (JSON values, so key order and
//!   spacing do not matter), and the answers recorded for one (name, arguments) are
//!   consumed in the order the original calls were made. There is no global order: calls
//!   fanned out over threads or `asyncio.gather` reach the host in a different order each
//!   time, and each still gets the answer its own arguments got.
//! - A call the original run never made with those arguments (or made fewer times) means
//!   the replayed code went another way (it depends on the time, randomness, the outside
//!   world): there is no answer to give, and making the call would be the very repeat a
//!   replay must not do. The replay fails saying which tool; the call gets an error and
//!   the run is interrupted at once.
//! - A recorded call (one that got an answer) the replayed run did not make by its end
//!   fails the replay too. Usually a thread of the session makes it: one started by an
//!   earlier run whose call landed in this run the first time, and has not yet this time.
//!   Left alone, that thread would make the call later, in a live run, for real: the
//!   very repeat a replay must not cause (a stranger's thread charged a card twice that
//!   way). A replay whose threads' timing differs from the original's is refused rather
//!   than trusted.
//! - A call that was still unanswered when the original run ended was answered
//!   `cancelled` by the worker itself as its job ended (see `pool::toolcalls`). Its replay
//!   is left unanswered likewise, so the replayed run's end cancels it the same way. (An
//!   answer that came in the instant the job ended is recorded as given, though the
//!   worker may have dropped it; its replay gets it. Only a thread racing its run's end
//!   can tell.)
//! - What is recorded is what reached the run's tools. A run interrupted by its client
//!   that still ended with exit code 0 is journaled, but its replay is not interrupted:
//!   the calls the interrupt cancelled stay unanswered in it, and calls made after the
//!   interrupt (answered `cancelled` without reaching the tools) have no recorded answer.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use snakecage_worker::protocol::{ToolCall, ToolErrorKind, ToolOutcome};
use tokio_util::sync::CancellationToken;

use crate::pool::toolcalls::{ToolFuture, ToolHost};

/// How much of a call's arguments a divergence message quotes.
const QUOTED_ARGUMENT_CHARS: usize = 200;

/// One call a journaled run made, and what the worker got for it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCall {
    pub name: String,
    pub arguments: Value,
    /// `None`: still unanswered when the run ended (the worker answered it `cancelled`).
    pub answer: Option<ToolOutcome>,
}

/// The calls of one run, in the order they were made, and the bytes they hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recording {
    pub calls: Vec<RecordedCall>,
    /// Names, arguments and answers as JSON. Counted in full even once the calls were
    /// dropped for going past the budget.
    pub bytes: usize,
}

/// The run's own tools, with every call and answer noted on the way through.
pub struct Recorder {
    tools: Arc<dyn ToolHost>,
    state: Arc<Mutex<RecorderState>>,
}

struct RecorderState {
    recording: Recording,
    /// Past this many bytes the journal overflows anyway (`sessions.replay_max_bytes`):
    /// the calls are dropped and only their bytes are counted on.
    budget: usize,
    dropped: bool,
}

impl RecorderState {
    fn count(&mut self, bytes: usize) {
        self.recording.bytes = self.recording.bytes.saturating_add(bytes);
        if self.recording.bytes > self.budget && !self.dropped {
            self.dropped = true;
            self.recording.calls = Vec::new();
        }
    }
}

impl Recorder {
    /// Records the calls answered by `tools`, keeping them while they hold at most
    /// `budget` bytes.
    pub fn new(tools: Arc<dyn ToolHost>, budget: usize) -> Self {
        Self {
            tools,
            state: Arc::new(Mutex::new(RecorderState {
                recording: Recording::default(),
                budget,
                dropped: false,
            })),
        }
    }

    /// Takes what was recorded (the whole run, once it has ended: its calls' futures are
    /// gone with it).
    pub fn take(&self) -> Recording {
        let mut state = self.state.lock().expect("recorder lock");
        state.dropped = true;
        std::mem::take(&mut state.recording)
    }
}

impl ToolHost for Recorder {
    fn call(&self, call: ToolCall) -> ToolFuture {
        let index = {
            let mut state = self.state.lock().expect("recorder lock");
            state.count(call.name.len() + json_len(&call.arguments));
            let index = state.recording.calls.len();
            if !state.dropped {
                state.recording.calls.push(RecordedCall {
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    answer: None,
                });
            }
            index
        };
        let answer = self.tools.call(call);
        let state = self.state.clone();
        // Noted when the answer is there: it goes to the worker in the same poll. A call
        // whose future is dropped first (the run ended) stays unanswered in the record.
        Box::pin(async move {
            let outcome = answer.await;
            let mut state = state.lock().expect("recorder lock");
            state.count(outcome_len(&outcome));
            if !state.dropped {
                state.recording.calls[index].answer = Some(outcome.clone());
            }
            outcome
        })
    }
}

/// Answers a replayed run's calls from its record, never calling a tool.
pub struct Replayer {
    /// "run 2 of 5", for the reason a replay fails.
    run: String,
    keys: Mutex<Vec<Recorded>>,
    diverged: Mutex<Option<String>>,
    /// Fired at the first call without a recorded answer: the replayed run is interrupted.
    stop: CancellationToken,
}

/// The answers still to give for one (name, arguments), in the order they were recorded.
struct Recorded {
    name: String,
    arguments: Value,
    answers: VecDeque<Option<ToolOutcome>>,
}

impl Replayer {
    /// Answers from `calls`, the record of `run` ("run 2 of 5").
    pub fn new(run: String, calls: &[RecordedCall]) -> Self {
        let mut keys: Vec<Recorded> = Vec::new();
        for call in calls {
            let answer = call.answer.clone();
            match keys
                .iter_mut()
                .find(|k| k.name == call.name && k.arguments == call.arguments)
            {
                Some(key) => key.answers.push_back(answer),
                None => keys.push(Recorded {
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    answers: VecDeque::from([answer]),
                }),
            }
        }
        Self {
            run,
            keys: Mutex::new(keys),
            diverged: Mutex::new(None),
            stop: CancellationToken::new(),
        }
    }

    /// Fired when the replayed run has diverged: interrupt it.
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// Why the replay cannot go on, once a call had no recorded answer.
    pub fn diverged(&self) -> Option<String> {
        self.diverged.lock().expect("replayer lock").clone()
    }

    /// Once the replayed run has ended: why the replay cannot go on if a call the original
    /// run made (and got an answer to) was not made again.
    pub fn unmade(&self) -> Option<String> {
        let keys = self.keys.lock().expect("replayer lock");
        let key = keys
            .iter()
            .find(|k| k.answers.iter().any(Option::is_some))?;
        let shown = quoted(&key.arguments);
        Some(format!(
            "the replay of {} ended without calling tool '{}' ({shown}) as the original run \
             did; a thread of the session that makes it later would call the tool again, so \
             a session whose threads make tool calls at times a replay cannot reproduce \
             cannot be replayed",
            self.run, key.name
        ))
    }

    /// The next recorded answer for `call`: `Err(seen)` when none is left, `seen` telling
    /// whether the original run made this call at all.
    fn next_answer(&self, call: &ToolCall) -> Result<Option<ToolOutcome>, bool> {
        let mut keys = self.keys.lock().expect("replayer lock");
        let key = keys
            .iter_mut()
            .find(|k| k.name == call.name && k.arguments == call.arguments)
            .ok_or(false)?;
        key.answers.pop_front().ok_or(true)
    }

    fn diverge(&self, call: &ToolCall, seen: bool) -> ToolOutcome {
        let quoted = quoted(&call.arguments);
        let how = if seen {
            "more often than the original run did"
        } else {
            "with arguments the original run did not use"
        };
        let why = format!(
            "the replay of {} called tool '{}' {how} ({quoted}); a replay answers tool calls \
             from the session's journal and never calls a tool again, so a run whose tool \
             calls depend on the time, randomness or anything outside the session cannot be \
             replayed",
            self.run, call.name
        );
        tracing::info!(run = %self.run, tool = %call.name, "replay diverged from its journal");
        self.diverged
            .lock()
            .expect("replayer lock")
            .get_or_insert(why);
        self.stop.cancel();
        ToolOutcome::error(
            ToolErrorKind::Unavailable,
            format!(
                "tool '{}' was not called: this session is being rebuilt by replay, which \
                 answers only the calls its original run made",
                call.name
            ),
        )
    }
}

impl ToolHost for Replayer {
    fn call(&self, call: ToolCall) -> ToolFuture {
        match self.next_answer(&call) {
            Ok(Some(outcome)) => Box::pin(std::future::ready(outcome)),
            // Unanswered the first time too: the end of the run cancels it.
            Ok(None) => Box::pin(std::future::pending()),
            Err(seen) => {
                let refused = self.diverge(&call, seen);
                Box::pin(std::future::ready(refused))
            }
        }
    }
}

/// `arguments` as JSON for a reason, cut to [`QUOTED_ARGUMENT_CHARS`] with an ellipsis.
fn quoted(arguments: &Value) -> String {
    let json = serde_json::to_string(arguments).unwrap_or_default();
    let mut shown: String = json.chars().take(QUOTED_ARGUMENT_CHARS).collect();
    if shown.len() < json.len() {
        shown.push('…');
    }
    shown
}

fn json_len(value: &Value) -> usize {
    serde_json::to_vec(value).map_or(0, |v| v.len())
}

fn outcome_len(outcome: &ToolOutcome) -> usize {
    match outcome {
        ToolOutcome::Ok { result } => json_len(result),
        ToolOutcome::Error { message, data, .. } => message.len() + json_len(data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: u64, name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            id,
            name: name.into(),
            arguments,
        }
    }

    fn ok(result: Value) -> ToolOutcome {
        ToolOutcome::Ok { result }
    }

    fn recorded(name: &str, arguments: Value, answer: Option<ToolOutcome>) -> RecordedCall {
        RecordedCall {
            name: name.into(),
            arguments,
            answer,
        }
    }

    /// Answers `{"n": arguments.n}`, or an error for `n` < 0; `wait` never answers.
    struct Tools {
        calls: std::sync::atomic::AtomicUsize,
    }

    impl ToolHost for Tools {
        fn call(&self, call: ToolCall) -> ToolFuture {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if call.name == "wait" {
                return Box::pin(std::future::pending());
            }
            let n = call.arguments["n"].as_i64().unwrap_or(0);
            Box::pin(async move {
                if n < 0 {
                    ToolOutcome::Error {
                        kind: ToolErrorKind::Failed,
                        message: "négatif".into(),
                        data: json!({"n": n}),
                    }
                } else {
                    ok(json!({"n": n, "mot": "grüße"}))
                }
            })
        }
    }

    fn tools() -> Arc<Tools> {
        Arc::new(Tools {
            calls: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    async fn answer(host: &dyn ToolHost, c: ToolCall) -> ToolOutcome {
        host.call(c).await
    }

    /// Whether the call's answer is held back (never comes).
    fn held(host: &dyn ToolHost, c: ToolCall) -> bool {
        let mut future = host.call(c);
        let waker = std::task::Waker::noop();
        future
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
            .is_pending()
    }

    #[tokio::test]
    async fn a_recorder_notes_each_call_its_answer_and_the_calls_the_run_left_unanswered() {
        let inner = tools();
        let recorder = Recorder::new(inner.clone(), usize::MAX);
        assert_eq!(
            answer(&recorder, call(1, "t", json!({"n": 1}))).await,
            ok(json!({"n": 1, "mot": "grüße"}))
        );
        let refused = answer(&recorder, call(2, "t", json!({"n": -1}))).await;
        assert!(matches!(refused, ToolOutcome::Error { .. }));
        // Dropped unanswered, as the end of a run drops it.
        drop(recorder.call(call(3, "wait", json!({"city": "Zürich"}))));
        let recording = recorder.take();
        assert_eq!(
            recording.calls,
            [
                recorded(
                    "t",
                    json!({"n": 1}),
                    Some(ok(json!({"n": 1, "mot": "grüße"})))
                ),
                recorded("t", json!({"n": -1}), Some(refused)),
                recorded("wait", json!({"city": "Zürich"}), None),
            ]
        );
        // Name, arguments, answer as JSON bytes (ü, ß, é take two):
        // 1 + 7 + 23 ({"mot":"grüße","n":1}), 1 + 8 + 8 ("négatif") + 8, 4 + 18.
        assert_eq!(recording.bytes, 31 + 25 + 22);
        assert_eq!(inner.calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_recorder_past_its_budget_drops_the_calls_and_counts_on() {
        let recorder = Recorder::new(tools(), 40);
        answer(&recorder, call(1, "t", json!({"n": 1}))).await;
        assert_eq!(recorder.take().calls.len(), 1);
        let recorder = Recorder::new(tools(), 40);
        answer(&recorder, call(1, "t", json!({"n": 1}))).await;
        answer(&recorder, call(2, "t", json!({"n": 2}))).await;
        answer(&recorder, call(3, "t", json!({"n": 3}))).await;
        let recording = recorder.take();
        assert!(recording.calls.is_empty(), "{recording:?}");
        assert_eq!(recording.bytes, 3 * 31);
    }

    #[tokio::test]
    async fn replayed_calls_match_by_name_and_json_arguments_in_order_per_key() {
        let record = [
            recorded("t", json!({"a": 1, "b": "é"}), Some(ok(json!("first")))),
            recorded("t", json!({"a": 2}), Some(ok(json!("other")))),
            recorded("t", json!({"a": 1, "b": "é"}), Some(ok(json!("second")))),
            recorded("u", json!({"a": 1, "b": "é"}), Some(ok(json!("u")))),
        ];
        let replayer = Replayer::new("run 2 of 3".into(), &record);
        // Another order across keys; the same key's answers in the order recorded; keys
        // compared as JSON values (the order of an object's members does not matter).
        assert_eq!(
            answer(&replayer, call(1, "u", json!({"b": "é", "a": 1}))).await,
            ok(json!("u"))
        );
        assert_eq!(
            answer(&replayer, call(2, "t", json!({"b": "é", "a": 1}))).await,
            ok(json!("first"))
        );
        assert_eq!(
            answer(&replayer, call(3, "t", json!({"a": 2}))).await,
            ok(json!("other"))
        );
        assert_eq!(
            answer(&replayer, call(4, "t", json!({"a": 1, "b": "é"}))).await,
            ok(json!("second"))
        );
        assert_eq!(replayer.diverged(), None);
        assert!(!replayer.stop().is_cancelled());
    }

    #[tokio::test]
    async fn a_call_without_a_recorded_answer_ends_the_replay_naming_the_tool() {
        let record = [recorded("météo", json!({"n": 1}), Some(ok(json!(1))))];
        // Other arguments (1.0 is not 1: Python sends them apart too).
        let replayer = Replayer::new("run 2 of 3".into(), &record);
        let refused = answer(&replayer, call(1, "météo", json!({"n": 1.0}))).await;
        assert!(
            matches!(
                &refused,
                ToolOutcome::Error { kind: ToolErrorKind::Unavailable, message, .. }
                    if message.contains("'météo' was not called")
            ),
            "{refused:?}"
        );
        let why = replayer.diverged().unwrap();
        assert!(
            why.starts_with(
                "the replay of run 2 of 3 called tool 'météo' with arguments the original run did not use ({\"n\":1.0})"
            ),
            "{why}"
        );
        assert!(replayer.stop().is_cancelled());
        // The first divergence is the one reported.
        answer(&replayer, call(2, "x", json!({}))).await;
        assert_eq!(replayer.diverged().unwrap(), why);

        // The same call once more than recorded.
        let replayer = Replayer::new("run 1 of 1".into(), &record);
        assert_eq!(
            answer(&replayer, call(1, "météo", json!({"n": 1}))).await,
            ok(json!(1))
        );
        answer(&replayer, call(2, "météo", json!({"n": 1}))).await;
        assert!(
            replayer
                .diverged()
                .unwrap()
                .contains("called tool 'météo' more often than the original run did"),
        );

        // Long arguments are quoted cut short.
        let replayer = Replayer::new("run 1 of 1".into(), &[]);
        answer(&replayer, call(1, "t", json!({"s": "ü".repeat(500)}))).await;
        let why = replayer.diverged().unwrap();
        assert!(why.contains("üüü…)"), "{why}");
        assert!(why.len() < 1000, "{why}");
    }

    #[tokio::test]
    async fn calls_unanswered_at_the_original_end_stay_unanswered_and_unmade_calls_are_named() {
        let record = [
            recorded("wait", json!({}), None),
            recorded("t", json!({"n": 1}), Some(ok(json!(1)))),
            recorded("t", json!({"n": 2}), Some(ok(json!(2)))),
        ];
        let replayer = Replayer::new("run 1 of 1".into(), &record);
        assert!(held(&replayer, call(1, "wait", json!({}))));
        assert_eq!(
            answer(&replayer, call(2, "t", json!({"n": 2}))).await,
            ok(json!(2))
        );
        // `t(n=1)` is never made: no divergence while the run goes on, and at its end the
        // replay is refused naming it (the unanswered `wait` is no matter).
        assert_eq!(replayer.diverged(), None);
        let why = replayer.unmade().unwrap();
        assert!(
            why.contains("without calling tool 't' ({\"n\":1})"),
            "{why}"
        );
        assert_eq!(
            answer(&replayer, call(3, "t", json!({"n": 1}))).await,
            ok(json!(1))
        );
        assert_eq!(replayer.unmade(), None);
    }

    #[tokio::test]
    async fn a_recording_replays_as_it_was_recorded() {
        let recorder = Recorder::new(tools(), usize::MAX);
        let mut answers = Vec::new();
        for (id, n) in [(1, 5), (2, -3), (3, 5)] {
            answers.push(answer(&recorder, call(id, "t", json!({"n": n}))).await);
        }
        let replayer = Replayer::new("run 1 of 1".into(), &recorder.take().calls);
        // In another order: each call gets the answer its own arguments got.
        for (id, n, i) in [(7, -3, 1), (8, 5, 0), (9, 5, 2)] {
            assert_eq!(
                answer(&replayer, call(id, "t", json!({"n": n}))).await,
                answers[i]
            );
        }
        assert_eq!(replayer.diverged(), None);
    }
}
