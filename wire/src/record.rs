//! Records: the plaintext of one Noise transport message (DESIGN.md, "The
//! wire", item 3). The first byte says what follows:
//!
//! ```text
//! 0x01 | JSON frame (UTF-8)
//! 0x02 | id length (u16 BE) | request id (UTF-8) | channel (u8) | raw bytes
//! 0x03 | last (u8: 0 more follow, 1 the last) | a part of a frame's JSON
//! ```
//!
//! A frame whose JSON does not fit one record goes as parts (0x03), in
//! order, the last marked; the receiver joins them ([`Assembler`], bounded
//! by its limit) and decodes the whole as a frame. Other records may come
//! between the parts; the parts of only one frame are open at a time.
//!
//! Pure: bytes in, typed values out. A record is at most
//! [`MAX_RECORD_LEN`] bytes, the plaintext that fits one Noise message.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use thiserror::Error;

use crate::frame::{self, Frame, FrameError, RequestId};

pub const KIND_FRAME: u8 = 0x01;
pub const KIND_CHUNK: u8 = 0x02;
pub const KIND_PART: u8 = 0x03;

/// The default bound on a frame sent in parts: 16 MiB of JSON.
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;

/// The largest record: a 65535-byte Noise message less its 16-byte tag.
pub const MAX_RECORD_LEN: usize = portcullis_crypto::MAX_PLAINTEXT_LEN;

/// Bytes a chunk record spends before its data: kind, id length, channel.
const CHUNK_FIXED_OVERHEAD: usize = 1 + 2 + 1;

#[derive(Debug, Clone, PartialEq)]
pub enum Record<'a> {
    Frame(Frame),
    Chunk(Chunk<'a>),
    Part(Part<'a>),
}

/// A part of a frame too large for one record (see [`Assembler`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part<'a> {
    pub last: bool,
    pub json: &'a [u8],
}

/// A slice of binary data belonging to one request. Chunks of one request
/// arrive in order; their data borrows from the decoded record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk<'a> {
    pub request_id: &'a str,
    pub channel: Channel,
    pub data: &'a [u8],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Channel {
    Stdout = 1,
    Stderr = 2,
    Stdin = 3,
    FileData = 4,
    Terminal = 5,
}

impl TryFrom<u8> for Channel {
    type Error = RecordError;
    fn try_from(byte: u8) -> Result<Self, RecordError> {
        Ok(match byte {
            1 => Self::Stdout,
            2 => Self::Stderr,
            3 => Self::Stdin,
            4 => Self::FileData,
            5 => Self::Terminal,
            other => return Err(RecordError::UnknownChannel(other)),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RecordError {
    #[error("empty record: a record starts with a kind byte (0x01 frame, 0x02 chunk)")]
    Empty,
    #[error("record is {len} bytes; at most {MAX_RECORD_LEN} fit one Noise message")]
    TooLarge { len: usize },
    #[error(
        "unknown record kind 0x{0:02x}: expected 0x01 (frame), 0x02 (chunk) or 0x03 (frame part)"
    )]
    UnknownKind(u8),
    #[error("chunk header is truncated: {need} bytes needed, {got} present")]
    ChunkTruncated { need: usize, got: usize },
    #[error("chunk request id is not UTF-8")]
    ChunkIdNotUtf8,
    #[error("chunk request id: {0}")]
    ChunkId(FrameError),
    #[error(
        "unknown chunk channel {0}: expected 1 stdout, 2 stderr, 3 stdin, 4 file data or 5 terminal"
    )]
    UnknownChannel(u8),
    #[error("frame part: the byte after 0x03 must be 0 (more follow) or 1 (the last), not {0}")]
    PartFlag(u8),
    #[error("a frame in parts is larger than {limit} bytes, the most this side takes")]
    PartsTooLarge { limit: usize },
    #[error(
        "frames arriving in parts already hold {budget} bytes on this side, its bound for them \
         all; send this frame again later"
    )]
    PartsBudgetSpent { budget: usize },
    #[error("{0}")]
    Frame(#[from] FrameError),
}

/// Decodes one record.
pub fn decode(record: &[u8]) -> Result<Record<'_>, RecordError> {
    if record.len() > MAX_RECORD_LEN {
        return Err(RecordError::TooLarge { len: record.len() });
    }
    let (&kind, body) = record.split_first().ok_or(RecordError::Empty)?;
    match kind {
        KIND_FRAME => Ok(Record::Frame(frame::decode_frame(body)?)),
        KIND_CHUNK => decode_chunk(body).map(Record::Chunk),
        KIND_PART => match body.split_first() {
            Some((0, json)) => Ok(Record::Part(Part { last: false, json })),
            Some((1, json)) => Ok(Record::Part(Part { last: true, json })),
            Some((&other, _)) => Err(RecordError::PartFlag(other)),
            None => Err(RecordError::PartFlag(0xff)),
        },
        other => Err(RecordError::UnknownKind(other)),
    }
}

fn decode_chunk(body: &[u8]) -> Result<Chunk<'_>, RecordError> {
    let truncated = |need| RecordError::ChunkTruncated {
        need,
        got: body.len(),
    };
    let [hi, lo, rest @ ..] = body else {
        return Err(truncated(2));
    };
    let id_len = usize::from(u16::from_be_bytes([*hi, *lo]));
    if rest.len() < id_len + 1 {
        return Err(truncated(2 + id_len + 1));
    }
    let (id, rest) = rest.split_at(id_len);
    let request_id = std::str::from_utf8(id).map_err(|_| RecordError::ChunkIdNotUtf8)?;
    frame::validate_id(request_id).map_err(RecordError::ChunkId)?;
    let (&channel, data) = rest
        .split_first()
        .ok_or_else(|| truncated(2 + id_len + 1))?;
    Ok(Chunk {
        request_id,
        channel: Channel::try_from(channel)?,
        data,
    })
}

/// Appends a frame record to `out`. Fails, leaving `out` as it was, if the
/// frame's JSON does not fit one record.
pub fn encode_frame(frame: &Frame, out: &mut Vec<u8>) -> Result<(), RecordError> {
    let start = out.len();
    out.push(KIND_FRAME);
    frame::encode_frame_json(frame, out);
    let len = out.len() - start;
    if len > MAX_RECORD_LEN {
        out.truncate(start);
        return Err(RecordError::TooLarge { len });
    }
    Ok(())
}

/// The records that carry `frame`: one frame record when its JSON fits,
/// else parts ([`KIND_PART`]). Fails if the JSON is larger than `max`.
pub fn encode_frame_records(frame: &Frame, max: usize) -> Result<Vec<Vec<u8>>, RecordError> {
    let mut out = RecordsOut {
        records: vec![Vec::with_capacity(256)],
        in_parts: false,
        json_len: 0,
        // A frame that fits one record goes whatever `max` says.
        max: max.max(MAX_RECORD_LEN - 1),
    };
    out.records[0].push(KIND_FRAME);
    if serde_json::to_writer(&mut out, frame).is_err() {
        // Serialising a frame cannot fail otherwise: every map key is a
        // string and no Serialize impl here returns an error.
        return Err(RecordError::PartsTooLarge { limit: max });
    }
    if out.in_parts
        && let Some(last) = out.records.last_mut()
    {
        last[1] = 1;
    }
    Ok(out.records)
}

/// Where [`encode_frame_records`] writes a frame's JSON: one frame record
/// while it fits, then part records filled as the JSON comes, each with
/// room for the seal's tag. So a large result is copied once, and never
/// into one buffer that grows to hold it all; a frame past `max` stops
/// being written there.
struct RecordsOut {
    records: Vec<Vec<u8>>,
    in_parts: bool,
    json_len: usize,
    max: usize,
}

impl RecordsOut {
    fn push_parts(&mut self, mut json: &[u8]) {
        while !json.is_empty() {
            let room = match self.records.last() {
                Some(last) => MAX_RECORD_LEN - last.len(),
                None => 0,
            };
            if room == 0 {
                let mut record = Vec::with_capacity(MAX_RECORD_LEN + portcullis_crypto::TAG_LEN);
                record.extend_from_slice(&[KIND_PART, 0]);
                self.records.push(record);
                continue;
            }
            let (now, rest) = json.split_at(room.min(json.len()));
            if let Some(last) = self.records.last_mut() {
                last.extend_from_slice(now);
            }
            json = rest;
        }
    }
}

impl std::io::Write for RecordsOut {
    fn write(&mut self, json: &[u8]) -> std::io::Result<usize> {
        self.json_len += json.len();
        if self.json_len > self.max {
            return Err(std::io::Error::other("the frame is larger than its limit"));
        }
        if !self.in_parts {
            match self.records.first_mut() {
                Some(one) if one.len() + json.len() <= MAX_RECORD_LEN => {
                    one.extend_from_slice(json);
                    return Ok(json.len());
                }
                // It does not fit one record: what was written so far is
                // the first part's.
                _ => {
                    let one = std::mem::take(&mut self.records);
                    self.in_parts = true;
                    if let Some(one) = one.first() {
                        self.push_parts(&one[1..]);
                    }
                }
            }
        }
        self.push_parts(json);
        Ok(json.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Bytes that every [`Assembler`] sharing it may hold together: one side's
/// bound on frames in parts across all its connections (each is bounded
/// by its own `limit` too). Cloning shares it.
#[derive(Debug, Clone)]
pub struct PartsBudget {
    held: Arc<AtomicUsize>,
    budget: usize,
}

impl PartsBudget {
    pub fn new(budget: usize) -> Self {
        Self {
            held: Arc::new(AtomicUsize::new(0)),
            budget,
        }
    }

    /// Bytes held now, by every assembler sharing it.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    fn take(&self, n: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&after| after <= self.budget)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Why a frame in parts is being dropped as its parts come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dropping {
    No,
    TooLarge,
    BudgetSpent,
}

/// For a writer whose transport carries whole messages (the plain and
/// JSON-RPC profiles): the frame records a session writes — a frame, or
/// its parts in order — joined back into whole frames' JSON.
#[derive(Debug, Default)]
pub struct FrameJoiner {
    parts: Vec<u8>,
    limit: usize,
}

/// Why a record cannot become a whole message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinError {
    /// A binary chunk: whole-message profiles have none.
    Chunk,
    /// Parts past the limit.
    TooLarge,
    /// Not a record at all.
    NotARecord,
}

impl FrameJoiner {
    /// Joins frames of at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            parts: Vec::new(),
            limit,
        }
    }

    /// A whole frame's JSON, `None` while its parts are still coming.
    pub fn push(&mut self, mut record: Vec<u8>) -> Result<Option<Vec<u8>>, JoinError> {
        match record.first().copied() {
            Some(KIND_FRAME) => {
                record.remove(0);
                Ok(Some(record))
            }
            Some(KIND_PART) if record.len() >= 2 => {
                if self.parts.len() + record.len() - 2 > self.limit {
                    self.parts = Vec::new();
                    return Err(JoinError::TooLarge);
                }
                self.parts.extend_from_slice(&record[2..]);
                match record[1] {
                    0 => Ok(None),
                    _ => Ok(Some(std::mem::take(&mut self.parts))),
                }
            }
            Some(KIND_CHUNK) => Err(JoinError::Chunk),
            _ => Err(JoinError::NotARecord),
        }
    }
}

/// Joins the parts of a frame sent in parts, holding at most `limit`
/// bytes (and, with a [`PartsBudget`], no more than it has left): past
/// either the rest is dropped as it comes, and the last part reports
/// [`RecordError::PartsTooLarge`] or [`RecordError::PartsBudgetSpent`].
#[derive(Debug)]
pub struct Assembler {
    json: Vec<u8>,
    limit: usize,
    dropping: Dropping,
    budget: Option<PartsBudget>,
}

impl Assembler {
    pub fn new(limit: usize) -> Self {
        Self {
            json: Vec::new(),
            limit,
            dropping: Dropping::No,
            budget: None,
        }
    }

    /// An assembler whose bytes count against `budget` too.
    pub fn sharing(limit: usize, budget: PartsBudget) -> Self {
        Self {
            json: Vec::new(),
            limit,
            dropping: Dropping::No,
            budget: Some(budget),
        }
    }

    /// Takes a part; after the last, the whole frame's JSON (decode it with
    /// [`frame::decode_frame`]) or why there is none.
    pub fn push(&mut self, part: Part<'_>) -> Option<Result<Vec<u8>, RecordError>> {
        if self.dropping == Dropping::No {
            let n = part.json.len();
            if self.json.len() + n > self.limit {
                self.dropping = Dropping::TooLarge;
                self.release();
            } else if self.budget.as_ref().is_some_and(|b| !b.take(n)) {
                self.dropping = Dropping::BudgetSpent;
                self.release();
            } else {
                self.json.extend_from_slice(part.json);
            }
        }
        if !part.last {
            return None;
        }
        let dropping = std::mem::replace(&mut self.dropping, Dropping::No);
        let json = std::mem::take(&mut self.json);
        if let Some(budget) = &self.budget {
            budget.give(json.len());
        }
        Some(match dropping {
            Dropping::No => Ok(json),
            Dropping::TooLarge => Err(RecordError::PartsTooLarge { limit: self.limit }),
            Dropping::BudgetSpent => Err(RecordError::PartsBudgetSpent {
                budget: self.budget.as_ref().map_or(0, |b| b.budget),
            }),
        })
    }

    /// Drops what is held, and gives it back to the budget.
    fn release(&mut self) {
        if let Some(budget) = &self.budget {
            budget.give(self.json.len());
        }
        self.json = Vec::new();
    }
}

impl Drop for Assembler {
    fn drop(&mut self) {
        self.release();
    }
}

/// The most data one chunk record for `request_id` can carry.
pub fn chunk_capacity(request_id: &RequestId) -> usize {
    MAX_RECORD_LEN - CHUNK_FIXED_OVERHEAD - request_id.as_str().len()
}

/// Appends a chunk record to `out`. `data` must fit: see [`chunk_capacity`].
pub fn encode_chunk(
    request_id: &RequestId,
    channel: Channel,
    data: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), RecordError> {
    let len = CHUNK_FIXED_OVERHEAD + request_id.as_str().len() + data.len();
    if len > MAX_RECORD_LEN {
        return Err(RecordError::TooLarge { len });
    }
    out.reserve(len);
    push_chunk_header(request_id, channel, out);
    out.extend_from_slice(data);
    Ok(())
}

fn push_chunk_header(request_id: &RequestId, channel: Channel, out: &mut Vec<u8>) {
    let id = request_id.as_str().as_bytes();
    // A valid RequestId is at most MAX_ID_LEN (128) bytes, far below u16::MAX.
    let id_len = u16::try_from(id.len()).unwrap_or(u16::MAX);
    out.push(KIND_CHUNK);
    out.extend_from_slice(&id_len.to_be_bytes());
    out.extend_from_slice(id);
    out.push(channel as u8);
}

/// A chunk record built in place: the header first, then data appended
/// straight into the same buffer (a download reads the file into it), so
/// the data is not copied behind a header later. The buffer has room for
/// the seal's tag too, which the channel appends without reallocating.
#[derive(Debug)]
pub struct ChunkRecord {
    buf: Vec<u8>,
    header_len: usize,
    /// Data bytes the record may carry.
    room: usize,
}

impl ChunkRecord {
    /// An empty chunk with room for `room` data bytes, or for as many as
    /// fit one record if that is fewer (see [`chunk_capacity`]).
    pub fn new(request_id: &RequestId, channel: Channel, room: usize) -> Self {
        let room = room.min(chunk_capacity(request_id));
        let header_len = CHUNK_FIXED_OVERHEAD + request_id.as_str().len();
        let mut buf = Vec::with_capacity(header_len + room + portcullis_crypto::TAG_LEN);
        push_chunk_header(request_id, channel, &mut buf);
        Self {
            buf,
            header_len,
            room,
        }
    }

    /// How many data bytes may still be appended.
    pub fn room(&self) -> usize {
        self.room.saturating_sub(self.data().len())
    }

    /// The buffer to append data to (append only: the header is in it),
    /// at most [`room`](Self::room) bytes; anything past that is cut off
    /// by [`into_record`](Self::into_record).
    pub fn buffer(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    pub fn data(&self) -> &[u8] {
        self.buf.get(self.header_len..).unwrap_or_default()
    }

    /// The finished record, at most [`MAX_RECORD_LEN`] bytes.
    pub fn into_record(mut self) -> Vec<u8> {
        debug_assert!(self.buf.len() >= self.header_len, "header cut into");
        self.buf.truncate(self.header_len + self.room);
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Cancel, Heartbeat};

    fn id(s: &str) -> RequestId {
        RequestId::new(s).unwrap()
    }

    #[test]
    fn a_joiner_gives_whole_frames_back_and_refuses_chunks_and_excess() {
        let frame = Frame::Ping(Heartbeat {
            id: Some("x".repeat(70_000)),
            ts: None,
        });
        let records = encode_frame_records(&frame, 1 << 20).unwrap();
        assert!(records.len() > 1, "in parts");
        let mut joiner = FrameJoiner::new(1 << 20);
        let mut whole = None;
        for record in records.clone() {
            assert!(whole.is_none(), "whole only after the last part");
            whole = joiner.push(record).unwrap();
        }
        let mut json = Vec::new();
        crate::frame::encode_frame_json(&frame, &mut json);
        assert_eq!(whole.unwrap(), json);
        let mut small = FrameJoiner::new(1000);
        let results: Vec<_> = records.into_iter().map(|r| small.push(r)).collect();
        assert!(results.contains(&Err(JoinError::TooLarge)));
        let mut chunk = Vec::new();
        encode_chunk(&id("c"), Channel::Stdout, b"data", &mut chunk).unwrap();
        assert_eq!(small.push(chunk), Err(JoinError::Chunk));
        assert_eq!(small.push(Vec::new()), Err(JoinError::NotARecord));
        let mut one = Vec::new();
        encode_frame(&Frame::Ping(Heartbeat::default()), &mut one).unwrap();
        assert_eq!(small.push(one.clone()).unwrap().unwrap(), one[1..].to_vec());
    }

    #[test]
    fn chunk_layout_is_as_documented() {
        let mut out = Vec::new();
        encode_chunk(&id("r1"), Channel::Stderr, b"oops", &mut out).unwrap();
        assert_eq!(
            out,
            [&[0x02, 0x00, 0x02][..], b"r1", &[2], b"oops"].concat()
        );
        let Record::Chunk(chunk) = decode(&out).unwrap() else {
            panic!("not a chunk")
        };
        assert_eq!(
            (chunk.request_id, chunk.channel, chunk.data),
            ("r1", Channel::Stderr, &b"oops"[..])
        );
    }

    fn big_response(bytes: usize) -> Frame {
        Frame::Response(crate::frame::Response::ok(
            id("big-1"),
            serde_json::json!({"stdout": "x".repeat(bytes)}),
        ))
    }

    /// The frame's whole JSON cut into records, as encoding did before it
    /// wrote records as it went.
    fn records_cut_from_whole(frame: &Frame, max: usize) -> Result<Vec<Vec<u8>>, RecordError> {
        let mut one = vec![KIND_FRAME];
        frame::encode_frame_json(frame, &mut one);
        if one.len() <= MAX_RECORD_LEN {
            return Ok(vec![one]);
        }
        let json = &one[1..];
        if json.len() > max {
            return Err(RecordError::PartsTooLarge { limit: max });
        }
        let count = json.len().div_ceil(MAX_RECORD_LEN - 2);
        Ok(json
            .chunks(MAX_RECORD_LEN - 2)
            .enumerate()
            .map(|(i, piece)| [&[KIND_PART, u8::from(i + 1 == count)], piece].concat())
            .collect())
    }

    /// Around one record's size, two and three parts', and the limit:
    /// the same records, byte for byte.
    #[test]
    fn records_written_as_the_json_comes_are_those_cut_from_the_whole() {
        let overhead = {
            let mut json = Vec::new();
            frame::encode_frame_json(&big_response(0), &mut json);
            json.len()
        };
        let around =
            |json_len: usize| json_len.saturating_sub(overhead + 3)..json_len - overhead + 3;
        let sizes = around(MAX_RECORD_LEN - 1)
            .chain(around(2 * (MAX_RECORD_LEN - 2)))
            .chain(around(3 * (MAX_RECORD_LEN - 2)))
            .chain([0, 10, 1 << 20]);
        for bytes in sizes {
            let frame = big_response(bytes);
            for max in [
                DEFAULT_MAX_FRAME,
                2 * MAX_RECORD_LEN,
                overhead + bytes,
                overhead + bytes - 1,
            ] {
                assert_eq!(
                    encode_frame_records(&frame, max),
                    records_cut_from_whole(&frame, max),
                    "{bytes} bytes of stdout, max {max}"
                );
            }
        }
    }

    /// Joins `records` as a receiver does; the frames it got.
    fn receive(records: &[Vec<u8>], limit: usize) -> Vec<Result<Frame, RecordError>> {
        let mut assembler = Assembler::new(limit);
        let mut frames = Vec::new();
        for record in records {
            match decode(record) {
                Ok(Record::Part(part)) => {
                    if let Some(joined) = assembler.push(part) {
                        frames.push(joined.and_then(|json| Ok(frame::decode_frame(&json)?)));
                    }
                }
                Ok(Record::Frame(frame)) => frames.push(Ok(frame)),
                other => panic!("{other:?}"),
            }
        }
        frames
    }

    #[test]
    fn a_frame_larger_than_a_record_goes_in_parts_and_comes_back_whole() {
        let small = big_response(10);
        assert_eq!(
            encode_frame_records(&small, DEFAULT_MAX_FRAME)
                .unwrap()
                .len(),
            1
        );
        let big = big_response(5 << 20);
        let records = encode_frame_records(&big, DEFAULT_MAX_FRAME).unwrap();
        assert_eq!(records.len(), (5 << 20) / (MAX_RECORD_LEN - 2) + 1);
        assert!(
            records
                .iter()
                .all(|r| r.len() <= MAX_RECORD_LEN && r[0] == KIND_PART)
        );
        let last: Vec<u8> = records.iter().map(|r| r[1]).collect();
        assert_eq!(last.iter().filter(|&&l| l == 1).count(), 1);
        assert_eq!(last.last(), Some(&1));
        let got = receive(&records, DEFAULT_MAX_FRAME);
        assert_eq!(got, [Ok(big.clone())]);
        // Beyond the sender's bound it is refused; beyond the receiver's,
        // dropped as it comes and reported once, at the last part.
        assert_eq!(
            encode_frame_records(&big, 1 << 20),
            Err(RecordError::PartsTooLarge { limit: 1 << 20 })
        );
        let mut twice = records.clone();
        twice.extend(encode_frame_records(&small, DEFAULT_MAX_FRAME).unwrap());
        let got = receive(&twice, 1 << 20);
        assert_eq!(
            got,
            [
                Err(RecordError::PartsTooLarge { limit: 1 << 20 }),
                Ok(small)
            ]
        );
    }

    #[test]
    fn assemblers_sharing_a_budget_hold_no_more_than_it_together() {
        let big = big_response(300_000);
        let records = encode_frame_records(&big, DEFAULT_MAX_FRAME).unwrap();
        let parts = |records: &[Vec<u8>]| -> Vec<Part<'static>> {
            records
                .iter()
                .map(|r| match decode(Box::leak(r.clone().into_boxed_slice())) {
                    Ok(Record::Part(part)) => part,
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        let budget = PartsBudget::new(500_000);
        let (mut a, mut b) = (
            Assembler::sharing(DEFAULT_MAX_FRAME, budget.clone()),
            Assembler::sharing(DEFAULT_MAX_FRAME, budget.clone()),
        );
        let (pa, pb) = (parts(&records), parts(&records));
        let (last_a, last_b) = (pa.len() - 1, pb.len() - 1);
        // Both half-way: a holds its frame but the last part; b runs out.
        for part in &pa[..last_a] {
            assert!(a.push(*part).is_none());
        }
        for part in &pb[..last_b] {
            assert!(b.push(*part).is_none());
        }
        assert!(budget.held() <= 500_000, "{}", budget.held());
        assert_eq!(
            b.push(pb[last_b]),
            Some(Err(RecordError::PartsBudgetSpent { budget: 500_000 }))
        );
        let whole = |got: Option<Result<Vec<u8>, RecordError>>| {
            frame::decode_frame(&got.unwrap().unwrap()).unwrap()
        };
        assert_eq!(whole(a.push(pa[last_a])), big);
        // Everything given back: the next frame fits again.
        assert_eq!(budget.held(), 0);
        for part in &pb {
            if let Some(done) = b.push(*part) {
                assert_eq!(whole(Some(done)), big);
            }
        }
        // An assembler dropped midway gives back what it held.
        let mut c = Assembler::sharing(DEFAULT_MAX_FRAME, budget.clone());
        assert!(c.push(pa[0]).is_none());
        assert!(budget.held() > 0);
        drop(c);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_part_s_flag_is_0_or_1() {
        assert_eq!(decode(&[KIND_PART, 2, b'{']), Err(RecordError::PartFlag(2)));
        assert_eq!(decode(&[KIND_PART]), Err(RecordError::PartFlag(0xff)));
    }

    #[test]
    fn a_full_chunk_fits_exactly() {
        let rid = id("req-7");
        let data = vec![0xAB; chunk_capacity(&rid)];
        let mut out = Vec::new();
        encode_chunk(&rid, Channel::FileData, &data, &mut out).unwrap();
        assert_eq!(out.len(), MAX_RECORD_LEN);
        assert!(encode_chunk(&rid, Channel::FileData, &[0; 1 + 65519], &mut Vec::new()).is_err());
    }

    #[test]
    fn a_chunk_built_in_place_holds_at_most_one_record_and_the_seal_s_tag() {
        let rid = id("req-7");
        let mut chunk = ChunkRecord::new(&rid, Channel::FileData, usize::MAX);
        assert_eq!(chunk.room(), chunk_capacity(&rid));
        let capacity = chunk.buffer().capacity();
        assert!(capacity >= MAX_RECORD_LEN + portcullis_crypto::TAG_LEN);
        chunk.buffer().resize(capacity, 0xAB);
        assert_eq!(chunk.room(), 0);
        let record = chunk.into_record();
        assert_eq!(record.len(), MAX_RECORD_LEN);
        let Record::Chunk(decoded) = decode(&record).unwrap() else {
            panic!("not a chunk")
        };
        assert_eq!(decoded.data, &vec![0xAB; chunk_capacity(&rid)][..]);
    }

    #[test]
    fn frame_records_round_trip() {
        let frame = Frame::Cancel(Cancel {
            id: id("r9"),
            reason: Some("user".into()),
        });
        let mut out = Vec::new();
        encode_frame(&frame, &mut out).unwrap();
        assert_eq!(out[0], KIND_FRAME);
        assert_eq!(decode(&out).unwrap(), Record::Frame(frame));
    }

    #[test]
    fn an_oversized_frame_is_refused_and_out_is_untouched() {
        let frame = Frame::Ping(Heartbeat {
            id: None,
            ts: Some("x".repeat(MAX_RECORD_LEN)),
        });
        let mut out = vec![7];
        assert!(matches!(
            encode_frame(&frame, &mut out),
            Err(RecordError::TooLarge { .. })
        ));
        assert_eq!(out, [7]);
    }

    #[test]
    fn malformed_records_say_what_is_wrong() {
        assert_eq!(decode(&[]), Err(RecordError::Empty));
        assert_eq!(decode(&[0x04, 1]), Err(RecordError::UnknownKind(4)));
        assert_eq!(
            decode(&[0x02, 0]),
            Err(RecordError::ChunkTruncated { need: 2, got: 1 })
        );
        assert_eq!(
            decode(&[0x02, 0, 5, b'a']),
            Err(RecordError::ChunkTruncated { need: 8, got: 3 })
        );
        assert_eq!(
            decode(&[0x02, 0, 1, b'a']),
            Err(RecordError::ChunkTruncated { need: 4, got: 3 })
        );
        assert_eq!(
            decode(&[0x02, 0, 1, b'a', 9]),
            Err(RecordError::UnknownChannel(9))
        );
        assert_eq!(
            decode(&[0x02, 0, 1, 0xFF, 1]),
            Err(RecordError::ChunkIdNotUtf8)
        );
        assert_eq!(
            decode(&[0x02, 0, 0, 1]),
            Err(RecordError::ChunkId(FrameError::EmptyId))
        );
        assert!(matches!(
            decode(b"\x01{"),
            Err(RecordError::Frame(FrameError::Json { .. }))
        ));
        assert!(matches!(
            decode(&vec![1; MAX_RECORD_LEN + 1]),
            Err(RecordError::TooLarge { .. })
        ));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    use super::*;
    use crate::frame::{Request, RequestContext};

    fn request_id() -> impl Strategy<Value = RequestId> {
        "[A-Za-z0-9_.:/-]{1,128}".prop_map(|s| RequestId::new(s).unwrap())
    }

    fn channel() -> impl Strategy<Value = Channel> {
        (1u8..=5).prop_map(|b| Channel::try_from(b).unwrap())
    }

    fn json_leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            ".{0,40}".prop_map(Value::String),
        ]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        json_leaf().prop_recursive(6, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{1,12}", inner, 0..8)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn arbitrary_frame_bodies_never_panic(body in ".{0,512}") {
            let record = [&[KIND_FRAME][..], body.as_bytes()].concat();
            let _ = decode(&record);
        }

        #[test]
        fn chunks_round_trip(id in request_id(), channel in channel(),
                             data in prop::collection::vec(any::<u8>(), 0..4096)) {
            let mut out = Vec::new();
            encode_chunk(&id, channel, &data, &mut out).unwrap();
            let decoded = decode(&out).unwrap();
            prop_assert_eq!(decoded, Record::Chunk(Chunk { request_id: id.as_str(), channel, data: &data }));
        }

        #[test]
        fn a_chunk_built_in_place_is_the_encoded_chunk(id in request_id(), channel in channel(),
                                                        data in prop::collection::vec(any::<u8>(), 0..4096),
                                                        room in 0usize..5000) {
            let mut chunk = ChunkRecord::new(&id, channel, room);
            prop_assert_eq!(chunk.room(), room);
            chunk.buffer().extend_from_slice(&data);
            let kept = data.len().min(room);
            prop_assert_eq!(chunk.room(), room.saturating_sub(data.len()));
            let mut expected = Vec::new();
            encode_chunk(&id, channel, &data[..kept], &mut expected).unwrap();
            prop_assert_eq!(chunk.into_record(), expected);
        }

        #[test]
        fn requests_round_trip(id in request_id(), method in "[a-z]{1,10}\\.[a-z_]{1,20}",
                               params in prop::collection::btree_map("[a-z_]{1,12}", json_value(), 0..6),
                               run_id in proptest::option::of("[a-z0-9]{1,40}")) {
            let frame = Frame::Request(Request {
                id,
                method,
                params: params.into_iter().collect::<Map<String, Value>>(),
                context: run_id.map(|run_id| RequestContext { run_id: Some(run_id), ..Default::default() }),
            });
            let mut out = Vec::new();
            encode_frame(&frame, &mut out).unwrap();
            prop_assert_eq!(decode(&out).unwrap(), Record::Frame(frame));
        }

        #[test]
        fn corrupted_records_never_panic(id in request_id(), data in prop::collection::vec(any::<u8>(), 0..256),
                                         edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
            let mut out = Vec::new();
            encode_chunk(&id, Channel::Stdout, &data, &mut out).unwrap();
            for (at, byte) in edits {
                let i = at % out.len();
                out[i] = byte;
            }
            let _ = decode(&out);
        }
    }
}
