//! A process's output, gathered from a `shell.attach` into one answer
//! (`read_process_output`, `wait_process`). Pure.

use portcullis_client::StreamItem;
use portcullis_wire::record::Channel;
use serde_json::{Value, json};

/// Output kept per stream; past it bytes are counted, not kept.
pub const MAX_KEPT: usize = 1 << 20;

#[derive(Debug, Default)]
pub struct Gathered {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Where the attach began (its `attached` frame).
    from_seq: Option<u64>,
    /// Bytes that came, kept or not.
    received: u64,
    /// Bytes not kept: past [`MAX_KEPT`], or gone from the ring.
    dropped: u64,
    /// Output the ring no longer held, which the sequence skips.
    missed: u64,
}

impl Gathered {
    pub fn take(&mut self, item: StreamItem) {
        match item {
            StreamItem::Chunk { channel, data } => {
                let out = match channel {
                    Channel::Stderr => &mut self.stderr,
                    _ => &mut self.stdout,
                };
                let room = MAX_KEPT.saturating_sub(out.len());
                out.extend_from_slice(&data[..data.len().min(room)]);
                self.dropped += data.len().saturating_sub(room) as u64;
                self.received += data.len() as u64;
            }
            StreamItem::Stream { event, data } => match event.as_str() {
                "attached" => {
                    let seq = |field: &str| data.get(field).and_then(Value::as_u64);
                    self.from_seq = seq("from_seq");
                    if data.get("truncated").and_then(Value::as_bool) == Some(true) {
                        let gone = seq("first_seq")
                            .unwrap_or(0)
                            .saturating_sub(seq("from_seq").unwrap_or(0));
                        self.missed += gone;
                    }
                }
                "output_truncated" => {
                    self.missed += data
                        .get("missed_bytes")
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                }
                _ => {}
            },
        }
    }

    /// The answer: the attach's result (a running process's
    /// `{state: "running", next_seq}`, or an exited one's exit result)
    /// with the output gathered.
    pub fn answer(self, result: &Value) -> Value {
        let running = result.get("state").and_then(Value::as_str) == Some("running");
        let next_seq = result
            .get("next_seq")
            .and_then(Value::as_u64)
            .or_else(|| Some(self.from_seq? + self.received + self.missed));
        let mut answer = json!({
            "process_id": result.get("process_id"),
            "running": running,
            "stdout": String::from_utf8_lossy(&self.stdout),
            "stderr": String::from_utf8_lossy(&self.stderr),
            "from_seq": self.from_seq,
            "next_seq": next_seq,
            "truncated": self.dropped > 0 || self.missed > 0,
        });
        if !running {
            for field in [
                "exit_code",
                "signal",
                "ended_by",
                "duration_ms",
                "timed_out",
            ] {
                answer[field] = result.get(field).cloned().unwrap_or(Value::Null);
            }
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(channel: Channel, data: &[u8]) -> StreamItem {
        StreamItem::Chunk {
            channel,
            data: data.to_vec().into(),
        }
    }

    #[test]
    fn output_is_kept_per_stream_and_the_sequence_goes_on_from_where_it_began() {
        let mut g = Gathered::default();
        g.take(StreamItem::Stream {
            event: "attached".into(),
            data: json!({"from_seq": 10, "first_seq": 10, "truncated": false}),
        });
        g.take(chunk(Channel::Stdout, b"one\n"));
        g.take(chunk(Channel::Stderr, b"two\n"));
        let answer = g.answer(&json!({"process_id": "p1", "exit_code": 3, "ended_by": "exit"}));
        assert_eq!(answer["stdout"], "one\n");
        assert_eq!(answer["stderr"], "two\n");
        assert_eq!(answer["next_seq"], 18);
        assert_eq!(answer["running"], false);
        assert_eq!(answer["exit_code"], 3);
        assert_eq!(answer["truncated"], false);
    }

    #[test]
    fn a_running_process_answers_its_next_seq_and_lost_output_is_said() {
        let mut g = Gathered::default();
        g.take(StreamItem::Stream {
            event: "attached".into(),
            data: json!({"from_seq": 0, "first_seq": 100, "truncated": true}),
        });
        g.take(chunk(Channel::Terminal, &vec![b'x'; MAX_KEPT + 5]));
        let answer =
            g.answer(&json!({"process_id": "p1", "state": "running", "next_seq": 2000000}));
        assert_eq!(answer["running"], true);
        assert_eq!(answer["next_seq"], 2000000);
        assert_eq!(answer["truncated"], true);
        assert_eq!(answer["stdout"].as_str().unwrap().len(), MAX_KEPT);
        assert!(answer.get("exit_code").is_none());
    }
}
