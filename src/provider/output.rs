//! A command's output as the relay spec sends it: `stream` frames whose
//! `data` is a string (`stdout`, `stderr`; a terminal's is `stdout`), each
//! naming where its first byte is in the output (`sequence`), so a client
//! that reattaches resumes exactly. Output that is not UTF-8 goes as
//! base64 (`encoding: "base64"`). A session that asked for chunks in
//! `relay.accepted` gets binary chunks instead (the fast path).
//!
//! Pure: bytes in, frames out; the shell provider sends them.

use base64::Engine as _;
use portcullis_wire::record::Channel;

/// Bytes of `data` a frame carries at most, as JSON text (escapes
/// counted): with the frame's other fields it stays well inside one record.
pub const FRAME_DATA: usize = 48 * 1024;
/// Output bytes a base64 frame carries at most (64 KiB of text would not fit).
const BASE64_BYTES: usize = FRAME_DATA / 4 * 3;

/// One `stream` frame of output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputFrame {
    pub event: &'static str,
    /// The output sequence number of its first byte.
    pub sequence: u64,
    pub data: String,
    pub base64: bool,
    /// How many output bytes it carries (`data` decoded).
    pub output_len: usize,
}

fn event(channel: Channel) -> &'static str {
    match channel {
        Channel::Stderr => "stderr",
        _ => "stdout",
    }
}

/// Turns output pieces into frames. A UTF-8 character cut at the end of a
/// piece is held back and joined to the next piece when that continues
/// it (same stream, next byte); otherwise it goes alone, as base64. So
/// every frame is one contiguous run of the output.
#[derive(Debug, Default)]
pub struct TextOutput {
    held: Option<(Channel, u64, Vec<u8>)>,
}

impl TextOutput {
    /// The frames for `data`, written to `channel` starting at `seq`.
    pub fn push(&mut self, channel: Channel, seq: u64, data: &[u8], out: &mut Vec<OutputFrame>) {
        let (start, joined);
        let bytes: &[u8] = match self.held.take() {
            Some((held_channel, held_seq, mut held))
                if held_channel == channel && held_seq + held.len() as u64 == seq =>
            {
                held.extend_from_slice(data);
                (start, joined) = (held_seq, held);
                &joined
            }
            other => {
                if let Some((held_channel, held_seq, held)) = other {
                    binary(event(held_channel), held_seq, &held, out);
                }
                start = seq;
                data
            }
        };
        let name = event(channel);
        let mut at = 0;
        while at < bytes.len() {
            let rest = &bytes[at..];
            let here = start + at as u64;
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    text_frames(name, here, text, out);
                    return;
                }
                Err(e) if e.valid_up_to() > 0 => {
                    let valid = e.valid_up_to();
                    let text = std::str::from_utf8(&rest[..valid]).unwrap_or_default();
                    text_frames(name, here, text, out);
                    at += valid;
                }
                // A character cut at the end: held for the next piece.
                Err(e) if e.error_len().is_none() => {
                    self.held = Some((channel, here, rest.to_vec()));
                    return;
                }
                // Not text: the rest of this piece goes as base64.
                Err(_) => {
                    binary(name, here, rest, out);
                    return;
                }
            }
        }
    }

    /// What is held back, as base64: at the end of the output, or before
    /// a gap in it.
    pub fn flush(&mut self, out: &mut Vec<OutputFrame>) {
        if let Some((channel, seq, held)) = self.held.take() {
            binary(event(channel), seq, &held, out);
        }
    }
}

/// `text` as frames whose escaped JSON fits [`FRAME_DATA`], split between
/// characters.
fn text_frames(event: &'static str, seq: u64, text: &str, out: &mut Vec<OutputFrame>) {
    let mut start = 0;
    let mut size = 0;
    for (at, c) in text.char_indices() {
        let escaped = match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        };
        if size + escaped > FRAME_DATA {
            out.push(OutputFrame {
                event,
                sequence: seq + start as u64,
                data: text[start..at].to_string(),
                base64: false,
                output_len: at - start,
            });
            (start, size) = (at, 0);
        }
        size += escaped;
    }
    if start < text.len() {
        out.push(OutputFrame {
            event,
            sequence: seq + start as u64,
            data: text[start..].to_string(),
            base64: false,
            output_len: text.len() - start,
        });
    }
}

fn binary(event: &'static str, seq: u64, bytes: &[u8], out: &mut Vec<OutputFrame>) {
    for (i, part) in bytes.chunks(BASE64_BYTES).enumerate() {
        out.push(OutputFrame {
            event,
            sequence: seq + (i * BASE64_BYTES) as u64,
            data: base64::engine::general_purpose::STANDARD.encode(part),
            base64: true,
            output_len: part.len(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frames(pieces: &[(Channel, &[u8])]) -> Vec<OutputFrame> {
        let mut text = TextOutput::default();
        let mut out = Vec::new();
        let mut seq = 0;
        for (channel, data) in pieces {
            text.push(*channel, seq, data, &mut out);
            seq += data.len() as u64;
        }
        text.flush(&mut out);
        out
    }

    /// Each frame as (event, sequence, data, whether base64).
    fn shown(out: &[OutputFrame]) -> Vec<(&str, u64, &str, bool)> {
        out.iter()
            .map(|f| (f.event, f.sequence, f.data.as_str(), f.base64))
            .collect()
    }

    fn bytes_of(frame: &OutputFrame) -> Vec<u8> {
        match frame.base64 {
            true => base64::engine::general_purpose::STANDARD
                .decode(&frame.data)
                .unwrap(),
            false => frame.data.clone().into_bytes(),
        }
    }

    #[test]
    fn text_is_text_and_a_cut_character_is_joined() {
        let euro = "€".as_bytes();
        let out = frames(&[
            (Channel::Stdout, &[b"a", &euro[..1]].concat()),
            (Channel::Stdout, &[&euro[1..], b"b"].concat()),
            (Channel::Stderr, b"oops\n"),
        ]);
        assert_eq!(
            shown(&out),
            [
                ("stdout", 0, "a", false),
                ("stdout", 1, "€b", false),
                ("stderr", 5, "oops\n", false)
            ]
        );
    }

    #[test]
    fn bytes_that_are_not_text_go_as_base64_and_a_cut_not_continued_too() {
        let out = frames(&[
            (Channel::Stdout, b"ok\xff\xfe"),
            (Channel::Stdout, b"\xe2\x82"),
            (Channel::Stderr, b"x"),
        ]);
        assert_eq!(
            shown(&out),
            [
                ("stdout", 0, "ok", false),
                ("stdout", 2, "//4=", true),
                ("stdout", 4, "4oI=", true),
                ("stderr", 6, "x", false)
            ]
        );
    }

    #[test]
    fn a_frame_s_escaped_data_fits_its_room() {
        let controls = vec![1u8; FRAME_DATA];
        let out = frames(&[(Channel::Stdout, &controls)]);
        assert!(out.len() >= 6, "{}", out.len());
        for frame in &out {
            let json = serde_json::to_string(&frame.data).unwrap();
            assert!(json.len() <= FRAME_DATA + 2, "{}", json.len());
        }
    }

    proptest! {
        /// Whatever the pieces, the frames carry every byte once, in
        /// order, each frame where its `sequence` says.
        #[test]
        fn frames_carry_the_output_exactly(
            pieces in proptest::collection::vec(
                (any::<bool>(), proptest::collection::vec(
                    prop_oneof![Just(0xe2u8), Just(0x82), Just(0xac), Just(b'a'), Just(0xff), Just(b'\n'), Just(1)],
                    0..40,
                )),
                0..12,
            )
        ) {
            let pieces: Vec<(Channel, &[u8])> = pieces
                .iter()
                .map(|(err, data)| (if *err { Channel::Stderr } else { Channel::Stdout }, data.as_slice()))
                .collect();
            let out = frames(&pieces);
            let mut all = Vec::new();
            for frame in &out {
                prop_assert_eq!(frame.sequence, all.len() as u64);
                all.extend(bytes_of(frame));
            }
            let expected: Vec<u8> = pieces.iter().flat_map(|(_, d)| d.iter().copied()).collect();
            prop_assert_eq!(all, expected);
        }
    }
}
