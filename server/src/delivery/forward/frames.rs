//! The frames that follow the handshake: a follower's requests (a delivery
//! with its header) and the leader's answers (what was stored, or why not),
//! and reading and writing them over a connection. Both sides and the fuzz
//! targets share this one codec, so the two ends cannot drift apart.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

use crate::store::{StoreError, StoreResult};
use mailcluster_model::{DeliveredTo, FlagSet, Flags, MessageMeta, NewDelivery};

/// What a request's header carries, as the leader reads it.
#[derive(Deserialize)]
struct Header {
    targets: Vec<i64>,
    internal_date: DateTime<Utc>,
    flags: u32,
    keywords: Vec<String>,
    meta: MessageMeta,
}

/// The leader's answer to one delivery.
#[derive(Debug)]
pub(super) enum Outcome {
    Done(StoreResult<Vec<DeliveredTo>>),
    /// Nothing stored: the leader is draining (look for the next one).
    Declined,
    /// Nothing stored: the leader has a full round of commits waiting (commit
    /// this one here, keep offering the next ones).
    Busy,
}

/// [`Header`] as the follower writes it, borrowed from the delivery (no copy of
/// the metadata per forwarded message).
#[derive(Serialize)]
struct HeaderRef<'a> {
    targets: &'a [i64],
    internal_date: DateTime<Utc>,
    flags: u32,
    keywords: &'a [String],
    meta: &'a MessageMeta,
}

/// Status of a delivery declined by a draining leader.
const DECLINED: u8 = 5;
/// Status of a delivery shed by a leader that is behind.
const BUSY: u8 = 6;

/// Writes queued frames, flushing when the queue is empty (frames queued
/// together leave in one write), until the queue is closed (the stream is then
/// shut down) or a write fails.
pub(super) async fn write_frames<W: AsyncWrite + Unpin>(
    mut queue: mpsc::UnboundedReceiver<Bytes>,
    mut out: BufWriter<W>,
) -> std::io::Result<()> {
    while let Some(frame) = queue.recv().await {
        let mut result = out.write_all(&frame).await;
        while result.is_ok() {
            match queue.try_recv() {
                Ok(frame) => result = out.write_all(&frame).await,
                Err(_) => break,
            }
        }
        result?;
        out.flush().await?;
    }
    let _ = out.shutdown().await;
    Ok(())
}

/// Reads one length-prefixed frame; None at a clean end of stream.
pub(super) async fn read_frame<R: AsyncRead + Unpin>(
    read: &mut R,
    max: usize,
) -> std::io::Result<Option<BytesMut>> {
    let len = match read.read_u32().await {
        Ok(len) => len as usize,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    };
    if len > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("frame of {len} bytes")));
    }
    let mut frame = BytesMut::zeroed(len);
    read.read_exact(&mut frame).await?;
    Ok(Some(frame))
}

pub(super) fn encode_request(id: u64, delivery: &NewDelivery) -> serde_json::Result<Bytes> {
    let header = serde_json::to_vec(&HeaderRef {
        targets: &delivery.targets,
        internal_date: delivery.internal_date,
        flags: delivery.flags.system.0,
        keywords: &delivery.flags.keywords,
        meta: &delivery.meta,
    })?;
    let len = 8 + 4 + header.len() + delivery.raw.len();
    let mut frame = BytesMut::with_capacity(4 + len);
    frame.put_u32(len as u32);
    frame.put_u64(id);
    frame.put_u32(header.len() as u32);
    frame.put_slice(&header);
    frame.put_slice(&delivery.raw);
    Ok(frame.freeze())
}

pub(super) fn decode_request(mut frame: BytesMut) -> Result<(u64, NewDelivery), String> {
    if frame.len() < 12 {
        return Err("short request".into());
    }
    let id = frame.get_u64();
    let header_len = frame.get_u32() as usize;
    if frame.len() < header_len {
        return Err("short request header".into());
    }
    let header: Header = serde_json::from_slice(&frame.split_to(header_len)).map_err(|e| e.to_string())?;
    let delivery = NewDelivery {
        raw: frame.freeze(),
        meta: header.meta,
        internal_date: header.internal_date,
        targets: header.targets,
        flags: FlagSet { system: Flags(header.flags), keywords: header.keywords },
    };
    Ok((id, delivery))
}

pub(super) fn encode_answer(id: u64, outcome: &Outcome) -> Bytes {
    let mut body = BytesMut::new();
    body.put_u64(id);
    match outcome {
        Outcome::Declined => body.put_u8(DECLINED),
        Outcome::Busy => body.put_u8(BUSY),
        Outcome::Done(Ok(delivered)) => {
            body.put_u8(0);
            for d in delivered {
                body.put_i64(d.mailbox_id);
                body.put_u32(d.uid);
                body.put_u64(d.modseq);
                body.put_u32(d.added);
            }
        }
        Outcome::Done(Err(e)) => {
            let (code, text) = match e {
                StoreError::NotFound(t) | StoreError::AlreadyExists(t) => (1, t),
                StoreError::Invalid(t) | StoreError::OverQuota(t) => (2, t),
                StoreError::Unavailable(t) => (3, t),
                StoreError::Internal(t) => (4, t),
            };
            body.put_u8(code);
            body.put_slice(text.as_bytes());
        }
    }
    let mut frame = BytesMut::with_capacity(4 + body.len());
    frame.put_u32(body.len() as u32);
    frame.put_slice(&body);
    frame.freeze()
}

pub(super) fn decode_answer(mut frame: BytesMut) -> Result<(u64, Outcome), String> {
    if frame.len() < 9 {
        return Err("short answer".into());
    }
    let id = frame.get_u64();
    let status = frame.get_u8();
    if status == 0 {
        if !frame.len().is_multiple_of(24) {
            return Err("malformed answer".into());
        }
        let mut delivered = Vec::with_capacity(frame.len() / 24);
        while frame.has_remaining() {
            delivered.push(DeliveredTo {
                mailbox_id: frame.get_i64(),
                uid: frame.get_u32(),
                modseq: frame.get_u64(),
                added: frame.get_u32(),
            });
        }
        return Ok((id, Outcome::Done(Ok(delivered))));
    }
    match status {
        DECLINED => return Ok((id, Outcome::Declined)),
        BUSY => return Ok((id, Outcome::Busy)),
        _ => {}
    }
    let text = String::from_utf8_lossy(&frame).into_owned();
    let err = match status {
        1 => StoreError::NotFound(text),
        2 => StoreError::Invalid(text),
        3 => StoreError::Unavailable(text),
        _ => StoreError::Internal(text),
    };
    Ok((id, Outcome::Done(Err(err))))
}

/// Entry points of the fuzz targets (`fuzz/`): both sides' frame reader,
/// decoders and encoders. Not for other use.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// A decoded answer, opaque but for its encoding and its `Debug` form.
    #[derive(Debug)]
    pub struct Answer(Outcome);

    impl Answer {
        pub fn encode(&self, id: u64) -> Bytes {
            encode_answer(id, &self.0)
        }
    }

    /// The follower's decoding of an answer frame (without its length prefix).
    pub fn decode_answer(frame: &[u8]) -> Result<(u64, Answer), String> {
        super::decode_answer(BytesMut::from(frame)).map(|(id, outcome)| (id, Answer(outcome)))
    }

    /// The leader's decoding of a request frame (without its length prefix).
    pub fn decode_request(frame: &[u8]) -> Result<(u64, NewDelivery), String> {
        super::decode_request(BytesMut::from(frame))
    }

    /// A request frame, length prefix included.
    pub fn encode_request(id: u64, delivery: &NewDelivery) -> serde_json::Result<Bytes> {
        super::encode_request(id, delivery)
    }

    /// One length-prefixed frame of at most `max` bytes; None at a clean end.
    pub async fn read_frame<R: AsyncRead + Unpin>(
        read: &mut R,
        max: usize,
    ) -> std::io::Result<Option<BytesMut>> {
        super::read_frame(read, max).await
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_delivery;
    use super::*;

    #[test]
    fn requests_and_answers_survive_the_wire() {
        let sent = test_delivery();
        let mut frame = BytesMut::from(&encode_request(42, &sent).unwrap()[..]);
        assert_eq!(frame.get_u32() as usize, frame.len());
        let (id, got) = decode_request(frame).unwrap();
        assert_eq!(id, 42);
        assert_eq!(
            (got.raw, got.meta, got.targets, got.flags),
            (sent.raw, sent.meta, sent.targets, sent.flags)
        );
        assert_eq!(got.internal_date, sent.internal_date);

        let delivered = vec![
            DeliveredTo { mailbox_id: 7, uid: 3, modseq: 11, added: 2 },
            DeliveredTo { mailbox_id: -1, uid: u32::MAX, modseq: u64::MAX, added: 0 },
        ];
        for result in
            [Ok(delivered), Err(StoreError::Unavailable("down".into())), Err(StoreError::Invalid("x".into()))]
        {
            let outcome = Outcome::Done(result);
            let mut frame = BytesMut::from(&encode_answer(9, &outcome)[..]);
            frame.get_u32();
            let (id, got) = decode_answer(frame).unwrap();
            assert_eq!(id, 9);
            assert_eq!(format!("{got:?}"), format!("{outcome:?}"));
        }
        let mut frame = BytesMut::from(&encode_answer(10, &Outcome::Declined)[..]);
        frame.get_u32();
        assert!(matches!(decode_answer(frame), Ok((10, Outcome::Declined))), "declined");
        let mut frame = BytesMut::from(&encode_answer(11, &Outcome::Busy)[..]);
        frame.get_u32();
        assert!(matches!(decode_answer(frame), Ok((11, Outcome::Busy))), "busy");
        assert!(decode_request(BytesMut::from(&b"short"[..])).is_err());
        assert!(decode_answer(BytesMut::from(&[0u8; 8 + 1 + 5][..])).is_err(), "a partial delivered entry");
    }
}
