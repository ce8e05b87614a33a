//! Streamed runs as their client sees them: the SSE events of `…/execute/stream`, the run's
//! id, and its caller tools' calls answered as they come (`answer_calls`, given a closure
//! that answers each one).

use serde_json::Value;

use crate::harness::Server;

/// Reads SSE events (`(event, data)`) from a streamed response.
pub struct Events {
    resp: reqwest::Response,
    /// Bytes until a whole event is in: a character may be split between two reads.
    buf: Vec<u8>,
}

impl Events {
    pub fn new(resp: reqwest::Response) -> Self {
        Self {
            resp,
            buf: Vec::new(),
        }
    }

    pub async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                let block = String::from_utf8(block).expect("an SSE event is UTF-8");
                let mut event = String::new();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(e) = line.strip_prefix("event: ") {
                        event = e.to_owned();
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    }
                }
                if event.is_empty() {
                    continue; // keep-alive comment
                }
                return Some((event, serde_json::from_str(&data).unwrap_or(Value::Null)));
            }
            let chunk = self.resp.chunk().await.ok()??;
            self.buf.extend_from_slice(&chunk);
        }
    }
}

/// A run started on a streaming route, with the server it runs on.
pub struct StreamedRun<'s> {
    server: &'s Server,
    /// Its `x-run-id`.
    pub run_id: String,
    events: Events,
    /// Every event read so far, in order.
    pub seen: Vec<(String, Value)>,
}

impl Server {
    /// Starts `body` on the streaming route `path` (`/v1/execute/stream` or a session's),
    /// which must answer 200 and name the run.
    pub async fn stream(&self, path: &str, body: &Value) -> StreamedRun<'_> {
        let resp = self.post_response(path, body).await;
        assert_eq!(resp.status(), 200);
        let run_id = resp.headers()["x-run-id"].to_str().unwrap().to_owned();
        StreamedRun {
            server: self,
            run_id,
            events: Events::new(resp),
            seen: Vec::new(),
        }
    }
}

impl StreamedRun<'_> {
    /// The next event (kept in `seen`); `None` at the end of the stream.
    pub async fn next(&mut self) -> Option<(String, Value)> {
        let next = self.events.next().await?;
        self.seen.push(next.clone());
        Some(next)
    }

    /// The data of the next event named `name`, the events before it passed over (they
    /// are in `seen`). Panics when the stream ends first.
    pub async fn until(&mut self, name: &str) -> Value {
        while let Some((event, data)) = self.next().await {
            if event == name {
                return data;
            }
        }
        panic!("the stream ended before a {name} event");
    }

    /// The `result` event's data: the run's response. Panics when the stream ends without.
    pub async fn result(&mut self) -> Value {
        self.until("result").await
    }

    /// Reads the stream up to its `result`, which it returns, handing each `tool_call`
    /// event's data to `on_call` as it comes (with this run, to answer it through).
    pub async fn answer_calls(&mut self, mut on_call: impl AsyncFnMut(&Self, &Value)) -> Value {
        while let Some((event, data)) = self.next().await {
            match event.as_str() {
                "tool_call" => on_call(self, &data).await,
                "result" => return data,
                _ => {}
            }
        }
        panic!("the stream ended without a result");
    }

    /// Reads the stream up to its `result`, which it returns, and cancels the run with
    /// `DELETE /v1/runs/{run_id}` (which must take it: 204) at the first event `when`
    /// accepts. Panics when the run ends before it was cancelled.
    pub async fn cancel_when(&mut self, when: impl Fn(&str, &Value) -> bool) -> Value {
        let mut cancelled = false;
        while let Some((event, data)) = self.next().await {
            if event == "result" {
                assert!(cancelled, "the run ended before it was cancelled: {data}");
                return data;
            }
            if !cancelled && when(&event, &data) {
                assert_eq!(self.cancel().await, 204);
                cancelled = true;
            }
        }
        panic!("the stream ended without a result");
    }

    /// The events read so far whose names are not among `expected`.
    pub fn events_other_than(&self, expected: &[&str]) -> Vec<&(String, Value)> {
        self.seen
            .iter()
            .filter(|(event, _)| !expected.contains(&event.as_str()))
            .collect()
    }

    /// The path that answers the call `call_id` of this run.
    pub fn call_path(&self, call_id: &str) -> String {
        format!("/v1/runs/{}/tool_calls/{call_id}", self.run_id)
    }

    /// Posts `answer` to the call a `tool_call` event (`call`) announced: the status and
    /// the body.
    pub async fn answer(&self, call: &Value, answer: &Value) -> (u16, Value) {
        let call_id = call["call_id"]
            .as_str()
            .expect("a tool_call event has a call_id");
        self.answer_id(call_id, answer).await
    }

    /// Posts `answer` to the call `call_id` of this run: the status and the body.
    pub async fn answer_id(&self, call_id: &str, answer: &Value) -> (u16, Value) {
        self.server.post(&self.call_path(call_id), answer).await
    }

    /// `DELETE /v1/runs/{run_id}`: the status.
    pub async fn cancel(&self) -> u16 {
        self.server
            .client
            .delete(format!("{}/v1/runs/{}", self.server.base, self.run_id))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }
}
