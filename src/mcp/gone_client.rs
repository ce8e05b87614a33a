//! rmcp's ERROR lines for an answer that had no one left to go to: a stateless `/mcp`
//! call answers through a channel that ends with its client's connection, so when the
//! client leaves mid-call (it disconnects, or gives up and closes the stream) rmcp's
//! serve loop fails to hand over the call's answer and logs an ERROR. A client that goes
//! away is normal: [`QuietGoneClients`] drops exactly those lines (the call's own line
//! says it ended, `call_tool` in [`super`]); every other rmcp error stays.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// The target of rmcp's serve loop.
const TARGET: &str = "rmcp::service";

/// rmcp's messages for an answer it could not send: during the drain after the client's
/// connection ended, and in the serve loop.
const UNSENT: &[&str] = &[
    "failed to send pending response during drain",
    "fail to response message",
];

/// The error of a send into a channel whose receiver is gone (tokio's `SendError`): the
/// HTTP answer of the call, dropped with its client's connection.
const RECEIVER_GONE: &str = "channel closed";

/// A layer that drops rmcp's ERROR for an answer whose client went away.
pub struct QuietGoneClients;

impl<S: Subscriber> Layer<S> for QuietGoneClients {
    fn event_enabled(&self, event: &Event<'_>, _cx: Context<'_, S>) -> bool {
        !is_gone_client(event)
    }
}

fn is_gone_client(event: &Event<'_>) -> bool {
    let meta = event.metadata();
    if meta.target() != TARGET || *meta.level() != Level::ERROR {
        return false;
    }
    let mut fields = Fields::default();
    event.record(&mut fields);
    UNSENT.contains(&fields.message.as_str()) && fields.error == RECEIVER_GONE
}

/// The `message` and `error` fields of an event, as text.
#[derive(Default)]
struct Fields {
    message: String,
    error: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "error" => self.error = format!("{value:?}"),
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_owned(),
            "error" => self.error = value.to_owned(),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Collects the messages of the events that get through.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl<S: Subscriber> Layer<S> for Seen {
        fn on_event(&self, event: &Event<'_>, _cx: Context<'_, S>) {
            let mut fields = Fields::default();
            event.record(&mut fields);
            self.0.lock().unwrap().push(fields.message);
        }
    }

    #[test]
    fn only_rmcps_error_for_an_answer_whose_client_left_is_dropped() {
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry()
            .with(QuietGoneClients)
            .with(seen.clone());
        tracing::subscriber::with_default(subscriber, || {
            let closed = tokio::sync::mpsc::error::SendError(());
            tracing::error!(target: "rmcp::service", error = %closed, "failed to send pending response during drain");
            tracing::error!(target: "rmcp::service", error = %closed, "fail to response message");
            // Another failure of the same send, another rmcp error, another target: kept.
            tracing::error!(target: "rmcp::service", error = "broken pipe", "failed to send pending response during drain");
            tracing::error!(target: "rmcp::service", error = %closed, "fail to close sink");
            tracing::error!(target: "snakecage", error = %closed, "fail to response message");
        });
        assert_eq!(
            *seen.0.lock().unwrap(),
            [
                "failed to send pending response during drain",
                "fail to close sink",
                "fail to response message"
            ]
        );
    }
}
