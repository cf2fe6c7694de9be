//! LSP-style framing (`Content-Length: N`, a blank line, N bytes of
//! JSON), as the spec's stdio and socket profiles carry messages.
//! Hostile input is bounded: a header line is at most 1 KiB, a header
//! section at most 32 lines, a message at most the caller's limit — the
//! length is checked before anything is allocated for it.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{MessageSink, MessageSource};
use crate::channel::ChannelError;

const MAX_HEADER_LINE: usize = 1024;
const MAX_HEADER_LINES: usize = 32;

/// Reads LSP-framed messages. Cancel-safe: a session drops a pending
/// read whenever something else needs it first, so everything read so far
/// is kept in `buf`, never in the future.
pub struct LspReader<R> {
    io: R,
    max_message: usize,
    buf: Vec<u8>,
    /// The body length of the message whose header `buf` begins with, and
    /// where its body starts.
    header: Option<(usize, usize)>,
}

impl<R: AsyncRead + Unpin + Send> LspReader<R> {
    pub fn new(io: R, max_message: usize) -> Self {
        Self {
            io,
            max_message,
            buf: Vec::with_capacity(8 * 1024),
            header: None,
        }
    }

    /// Parses the header at the start of `buf` if it is whole: the body's
    /// length and where it starts.
    fn parse_header(&mut self) -> Result<Option<(usize, usize)>, ChannelError> {
        let mut at = 0;
        let mut lines = 0;
        let mut length = None;
        loop {
            let Some(newline) = self.buf[at..].iter().position(|&b| b == b'\n') else {
                if self.buf.len() - at > MAX_HEADER_LINE {
                    return Err(framing(format!(
                        "a header line longer than {MAX_HEADER_LINE} bytes"
                    )));
                }
                return Ok(None);
            };
            if newline > MAX_HEADER_LINE {
                return Err(framing(format!(
                    "a header line longer than {MAX_HEADER_LINE} bytes"
                )));
            }
            let mut line = &self.buf[at..at + newline];
            at += newline + 1;
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            if line.is_empty() {
                if lines == 0 {
                    // Blank lines between messages are tolerated.
                    self.buf.drain(..at);
                    at = 0;
                    continue;
                }
                let n = length.ok_or_else(|| framing("a message without Content-Length"))?;
                return Ok(Some((n, at)));
            }
            lines += 1;
            if lines > MAX_HEADER_LINES {
                return Err(framing(format!(
                    "more than {MAX_HEADER_LINES} header lines"
                )));
            }
            let text =
                std::str::from_utf8(line).map_err(|_| framing("a header that is not UTF-8"))?;
            let Some((name, value)) = text.split_once(':') else {
                return Err(framing(format!(
                    "`{}` is not a `Name: value` header",
                    clip(text)
                )));
            };
            if name.trim().eq_ignore_ascii_case("content-length") {
                let n: usize = value.trim().parse().map_err(|_| {
                    framing(format!(
                        "Content-Length `{}` is not a number",
                        clip(value.trim())
                    ))
                })?;
                if n > self.max_message {
                    return Err(framing(format!(
                        "a message of {n} bytes; at most {} are taken (max_frame)",
                        self.max_message
                    )));
                }
                length = Some(n);
            }
            // Other headers (Content-Type) are allowed and ignored.
        }
    }
}

impl<R: AsyncRead + Unpin + Send> MessageSource for LspReader<R> {
    async fn next(&mut self) -> Result<Vec<u8>, ChannelError> {
        loop {
            if self.header.is_none() {
                self.header = self.parse_header()?;
            }
            if let Some((n, body)) = self.header {
                if self.buf.len() >= body + n {
                    let message = self.buf[body..body + n].to_vec();
                    self.buf.drain(..body + n);
                    self.header = None;
                    return Ok(message);
                }
                // Room for the rest of this message at once; the length
                // was bounded by `max_message` before anything was kept.
                self.buf.reserve(body + n - self.buf.len());
            }
            let mut chunk = [0u8; 8 * 1024];
            let read = self.io.read(&mut chunk).await.map_err(io)?;
            if read == 0 {
                return Err(ChannelError::Closed {
                    reason: match (
                        self.header.is_some(),
                        self.buf.iter().all(u8::is_ascii_whitespace),
                    ) {
                        (true, _) => Some("the input ended inside a message".into()),
                        (false, true) => None,
                        (false, false) => Some("the input ended inside a header".into()),
                    },
                });
            }
            self.buf.extend_from_slice(&chunk[..read]);
        }
    }
}

/// Writes LSP-framed messages.
pub struct LspWriter<W> {
    io: W,
}

impl<W: AsyncWrite + Unpin + Send> LspWriter<W> {
    pub fn new(io: W) -> Self {
        Self { io }
    }
}

impl<W: AsyncWrite + Unpin + Send> MessageSink for LspWriter<W> {
    async fn write(&mut self, message: &[u8], flush: bool) -> Result<(), ChannelError> {
        let header = format!("Content-Length: {}\r\n\r\n", message.len());
        self.io.write_all(header.as_bytes()).await.map_err(io)?;
        self.io.write_all(message).await.map_err(io)?;
        if flush {
            self.io.flush().await.map_err(io)?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ChannelError> {
        self.io.flush().await.map_err(io)
    }

    async fn close(&mut self, _policy: bool, _reason: &str) {
        let _ = self.io.flush().await;
        let _ = self.io.shutdown().await;
    }
}

fn framing(why: impl Into<String>) -> ChannelError {
    ChannelError::Profile(format!("framing: {}", why.into()))
}

fn io(e: std::io::Error) -> ChannelError {
    match e.kind() {
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
            ChannelError::Closed { reason: None }
        }
        _ => ChannelError::Profile(format!("I/O: {e}")),
    }
}

fn clip(text: &str) -> String {
    text.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read_all(input: &[u8], max: usize) -> (Vec<Vec<u8>>, ChannelError) {
        let mut reader = LspReader::new(input, max);
        let mut got = Vec::new();
        loop {
            match reader.next().await {
                Ok(m) => got.push(m),
                Err(e) => return (got, e),
            }
        }
    }

    #[tokio::test]
    async fn messages_are_read_with_any_line_ending_and_extra_headers() {
        let input = b"Content-Length: 2\r\n\r\n{}Content-Type: application/vscode-jsonrpc; charset=utf-8\r\ncontent-length: 7\r\n\r\n{\"a\":1}\ncontent-length:3\n\n[1]";
        let (got, end) = read_all(input, 100).await;
        assert_eq!(
            got,
            vec![b"{}".to_vec(), b"{\"a\":1}".to_vec(), b"[1]".to_vec()]
        );
        assert!(
            matches!(end, ChannelError::Closed { reason: None }),
            "{end}"
        );
    }

    #[tokio::test]
    async fn hostile_headers_end_the_channel_with_a_reason_and_allocate_nothing_large() {
        for (input, expect) in [
            (&b"Content-Length: 99999999999\r\n\r\n"[..], "at most 100"),
            (b"Content-Length: ten\r\n\r\n", "not a number"),
            (b"X: y\r\n\r\n{}", "without Content-Length"),
            (b"garbage\r\n\r\n", "not a `Name: value`"),
            (b"Content-Length: 5\r\n\r\n{}", "inside a message"),
            (b"Content-Length: 5\r\n", "inside a header"),
        ] {
            let (got, end) = read_all(input, 100).await;
            assert!(got.is_empty());
            assert!(end.to_string().contains(expect), "{end} lacks {expect}");
        }
        let long = vec![b'a'; 5000];
        let (_, end) = read_all(&long, 100).await;
        assert!(end.to_string().contains("longer than 1024"), "{end}");
        let many = "A: b\r\n".repeat(40);
        let (_, end) = read_all(many.as_bytes(), 100).await;
        assert!(end.to_string().contains("more than 32"), "{end}");
    }

    #[tokio::test]
    async fn a_read_dropped_half_way_loses_nothing() {
        // The session drops a pending read whenever another event wins its
        // select: the next read must go on where that one stopped.
        let (mut client, server) = tokio::io::duplex(64);
        let mut reader = LspReader::new(server, 100);
        for piece in [&b"Content-Le"[..], b"ngth: 7\r", b"\n\r\n{\"a\""] {
            client.write_all(piece).await.unwrap();
            let early =
                tokio::time::timeout(std::time::Duration::from_millis(20), reader.next()).await;
            assert!(early.is_err(), "a message before it was whole");
        }
        client
            .write_all(b":1}Content-Length: 2\r\n\r\n{}")
            .await
            .unwrap();
        assert_eq!(reader.next().await.unwrap(), b"{\"a\":1}");
        assert_eq!(reader.next().await.unwrap(), b"{}");
    }

    #[tokio::test]
    async fn what_the_writer_writes_the_reader_reads() {
        let mut out = Vec::new();
        {
            let mut writer = LspWriter::new(&mut out);
            writer.write(b"{\"x\":\"\xc3\xa9\"}", true).await.unwrap();
        }
        assert!(out.starts_with(b"Content-Length: 10\r\n\r\n"));
        let (got, _) = read_all(&out, 100).await;
        assert_eq!(got, vec![b"{\"x\":\"\xc3\xa9\"}".to_vec()]);
    }
}
