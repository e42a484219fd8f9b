//! A minimal AMQP 0-9-1 client over a plain socket, for messages that a
//! client library may not survive: header tables nested thousands of levels
//! deep (a recursive decoder can exhaust its stack) and content headers
//! close to `frame_max`. It publishes such messages with a confirm and reads
//! queues back without decoding header values: tables are length-prefixed,
//! so the top level is walked and nested values are kept as bytes.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// Bound on any single answer from the broker.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
const CLASS_BASIC: u16 = 60;

/// What went wrong talking to the broker (a close from it included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawError(pub String);

impl std::fmt::Display for RawError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

type Result<T> = std::result::Result<T, RawError>;

fn err<T>(what: impl Into<String>) -> Result<T> {
    Err(RawError(what.into()))
}

/// How the broker answered a confirmed publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawConfirm {
    /// basic.ack, not returned.
    Ack,
    /// basic.nack.
    Nack,
    /// basic.return (reply code and text), then an ack.
    Returned(u16, String),
}

/// A message read back: the properties a test accounts by, the header table
/// as raw bytes, and the body.
#[derive(Debug, Clone)]
pub struct RawMessage {
    /// The `message_id` property.
    pub message_id: Option<String>,
    /// The `delivery_mode` property.
    pub delivery_mode: Option<u8>,
    /// The header table's content (without its length prefix), if any.
    pub headers: Option<Vec<u8>>,
    /// The payload.
    pub body: Vec<u8>,
    /// Every short-string property, as the bytes that came.
    pub short: Vec<(Short, Vec<u8>)>,
}

impl RawMessage {
    /// Short-string property `which`, as the bytes that came.
    pub fn short(&self, which: Short) -> Option<&[u8]> {
        self.short
            .iter()
            .find(|(s, _)| *s == which)
            .map(|(_, b)| b.as_slice())
    }

    /// The top-level header keys, as the bytes that came.
    pub fn header_keys(&self) -> Vec<Vec<u8>> {
        let Some(table) = &self.headers else {
            return Vec::new();
        };
        let mut r = Reader::new(table);
        let mut keys = Vec::new();
        while !r.done() {
            let n = r.u8().unwrap_or_else(|e| panic!("header key: {e}")) as usize;
            keys.push(
                r.take(n)
                    .unwrap_or_else(|e| panic!("header key: {e}"))
                    .to_vec(),
            );
            r.skip_value()
                .unwrap_or_else(|e| panic!("header value: {e}"));
        }
        keys
    }

    /// Top-level header entries: each key with its value's encoding (type
    /// byte then value). Nested tables are not decoded.
    pub fn header_entries(&self) -> Vec<(String, Vec<u8>)> {
        let Some(table) = &self.headers else {
            return Vec::new();
        };
        let mut r = Reader::new(table);
        let mut out = Vec::new();
        while !r.done() {
            let key = r.shortstr().unwrap_or_else(|e| panic!("header key: {e}"));
            let start = r.pos;
            r.skip_value()
                .unwrap_or_else(|e| panic!("header {key}: {e}"));
            out.push((key, table[start..r.pos].to_vec()));
        }
        out
    }

    /// The encoded value (type byte first) of top-level header `key`.
    pub fn header_value(&self, key: &str) -> Option<Vec<u8>> {
        self.header_entries()
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
}

/// A short-string property, numbered by its bit in the property flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Short {
    ContentType = 15,
    ContentEncoding = 14,
    CorrelationId = 10,
    ReplyTo = 9,
    Expiration = 8,
    MessageId = 7,
    Type = 5,
    UserId = 4,
    AppId = 3,
    ClusterId = 2,
}

impl Short {
    fn of_bit(bit: u8) -> Option<Self> {
        [
            Self::ContentType,
            Self::ContentEncoding,
            Self::CorrelationId,
            Self::ReplyTo,
            Self::Expiration,
            Self::MessageId,
            Self::Type,
            Self::UserId,
            Self::AppId,
            Self::ClusterId,
        ]
        .into_iter()
        .find(|s| *s as u8 == bit)
    }
}

/// Properties of a message published with [`RawClient::publish`].
#[derive(Debug, Clone, Default)]
pub struct RawProperties {
    /// `message_id`.
    pub message_id: Option<String>,
    /// `delivery_mode` (2 = persistent).
    pub delivery_mode: Option<u8>,
    /// Top-level header entries: key and encoded value (see [`encode`]).
    pub headers: Vec<(String, Vec<u8>)>,
    /// More short-string properties, as bytes (UTF-8 or not); one given
    /// here wins over `message_id`.
    pub short: Vec<(Short, Vec<u8>)>,
    /// More top-level header entries, after `headers`, whose keys are
    /// bytes (UTF-8 or not).
    pub raw_headers: Vec<(Vec<u8>, Vec<u8>)>,
}

impl RawProperties {
    /// The content header's property flags and property list.
    pub fn encode(&self) -> Vec<u8> {
        // Each property present, by its flag bit, encoded.
        let mut present: Vec<(u8, Vec<u8>)> = Vec::new();
        for (which, bytes) in &self.short {
            let mut encoded = Vec::new();
            put_short_bytes(&mut encoded, bytes);
            present.push((*which as u8, encoded));
        }
        if let Some(id) = &self.message_id
            && !self.short.iter().any(|(s, _)| *s == Short::MessageId)
        {
            let mut encoded = Vec::new();
            put_shortstr(&mut encoded, id);
            present.push((Short::MessageId as u8, encoded));
        }
        if !self.headers.is_empty() || !self.raw_headers.is_empty() {
            let mut entries: Vec<(Vec<u8>, Vec<u8>)> = self
                .headers
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.clone()))
                .collect();
            entries.extend(self.raw_headers.iter().cloned());
            present.push((13, encode::table(&entries)));
        }
        if let Some(mode) = self.delivery_mode {
            present.push((12, vec![mode]));
        }
        present.sort_by_key(|(bit, _)| std::cmp::Reverse(*bit));
        let flags = present.iter().fold(0u16, |f, (bit, _)| f | 1 << bit);
        let mut out = flags.to_be_bytes().to_vec();
        for (_, encoded) in present {
            out.extend(encoded);
        }
        out
    }
}

/// Encoders for header values (type byte then value).
pub mod encode {
    /// A table: `u32` length then the entries.
    pub fn table<K: AsRef<[u8]>>(entries: &[(K, Vec<u8>)]) -> Vec<u8> {
        let mut content = Vec::new();
        for (key, value) in entries {
            super::put_short_bytes(&mut content, key.as_ref());
            content.extend(value);
        }
        let mut out = (content.len() as u32).to_be_bytes().to_vec();
        out.extend(content);
        out
    }

    /// A table value: `F` then the table.
    pub fn table_value(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
        let mut out = vec![b'F'];
        out.extend(table(entries));
        out
    }

    /// A long string value: `S`, `u32` length, bytes.
    pub fn long_string(s: &[u8]) -> Vec<u8> {
        let mut out = vec![b'S'];
        out.extend((s.len() as u32).to_be_bytes());
        out.extend(s);
        out
    }

    /// A boolean value.
    pub fn boolean(b: bool) -> Vec<u8> {
        vec![b't', u8::from(b)]
    }

    /// A table value nested `depth` levels deep: `{key: {key: ... {}}}`,
    /// built from the inside out without recursion.
    pub fn nested_table_value(key: &str, depth: usize) -> Vec<u8> {
        let mut inner = table::<String>(&[]);
        for _ in 1..depth {
            let mut entry = Vec::with_capacity(inner.len() + key.len() + 6);
            super::put_shortstr(&mut entry, key);
            entry.push(b'F');
            entry.extend(&inner);
            inner = (entry.len() as u32).to_be_bytes().to_vec();
            inner.extend(entry);
        }
        let mut out = vec![b'F'];
        out.extend(inner);
        out
    }
}

fn put_shortstr(out: &mut Vec<u8>, s: &str) {
    put_short_bytes(out, s.as_bytes());
}

fn put_short_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    assert!(bytes.len() < 256, "short string too long: {bytes:?}");
    out.push(bytes.len() as u8);
    out.extend(bytes);
}

fn put_longstr(out: &mut Vec<u8>, s: &[u8]) {
    out.extend((s.len() as u32).to_be_bytes());
    out.extend(s);
}

/// A cursor over a method or content header payload.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.pos + n > self.buf.len() {
            return err(format!(
                "truncated: need {n} bytes at {} of {}",
                self.pos,
                self.buf.len()
            ));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    fn shortstr(&mut self) -> Result<String> {
        let n = self.u8()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }

    fn longstr(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    /// Skips one field value (type byte included) without decoding nested ones.
    fn skip_value(&mut self) -> Result<()> {
        let size = match self.u8()? {
            b't' | b'b' | b'B' => 1,
            b's' | b'u' => 2,
            b'I' | b'i' | b'f' => 4,
            b'l' | b'L' | b'd' | b'T' => 8,
            b'D' => 5,
            b'V' => 0,
            b'S' | b'x' | b'A' | b'F' => self.u32()? as usize,
            other => return err(format!("unknown field type {:?}", other as char)),
        };
        self.take(size).map(|_| ())
    }
}

/// One AMQP connection with one channel (number 1).
pub struct RawClient {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    frame_max: u32,
    confirm: bool,
    next_tag: u64,
}

impl RawClient {
    /// Connects with guest/guest to `vhost` and opens channel 1.
    pub async fn connect(addr: SocketAddr, vhost: &str) -> Result<RawClient> {
        let stream = tokio::time::timeout(ANSWER_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| RawError(format!("connect to {addr} timed out")))?
            .map_err(|e| RawError(format!("connect to {addr}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let (r, w) = stream.into_split();
        let mut client = RawClient {
            reader: BufReader::with_capacity(256 * 1024, r),
            writer: w,
            frame_max: 131_072,
            confirm: false,
            next_tag: 1,
        };
        client.write(b"AMQP\x00\x00\x09\x01").await?;
        client.expect_method(0, 10, 10).await?;
        let mut start_ok = Vec::new();
        start_ok.extend(encode::table(&[(
            "connection_name".to_string(),
            encode::long_string(b"sy-raw-client"),
        )]));
        put_shortstr(&mut start_ok, "PLAIN");
        put_longstr(&mut start_ok, b"\0guest\0guest");
        put_shortstr(&mut start_ok, "en_US");
        client.send_method(0, 10, 11, &start_ok).await?;
        let tune = client.expect_method(0, 10, 30).await?;
        let mut r = Reader::new(&tune);
        let channel_max = r.u16()?;
        let frame_max = r.u32()?;
        if frame_max != 0 {
            client.frame_max = frame_max;
        }
        let mut tune_ok = Vec::new();
        tune_ok.extend(channel_max.to_be_bytes());
        tune_ok.extend(client.frame_max.to_be_bytes());
        tune_ok.extend(0u16.to_be_bytes());
        client.send_method(0, 10, 31, &tune_ok).await?;
        let mut open = Vec::new();
        put_shortstr(&mut open, vhost);
        put_shortstr(&mut open, "");
        open.push(0);
        client.send_method(0, 10, 40, &open).await?;
        client.expect_method(0, 10, 41).await?;
        client.send_method(1, 20, 10, &[0]).await?;
        client.expect_method(1, 20, 11).await?;
        Ok(client)
    }

    /// The negotiated `frame_max`.
    pub fn frame_max(&self) -> u32 {
        self.frame_max
    }

    /// Puts the channel in confirm mode.
    pub async fn confirm_select(&mut self) -> Result<()> {
        self.send_method(1, 85, 10, &[0]).await?;
        self.expect_method(1, 85, 11).await?;
        self.confirm = true;
        Ok(())
    }

    /// Size of the content header frame (frame overhead included) that
    /// `props` produce.
    pub fn header_frame_size(props: &RawProperties) -> usize {
        8 + 12 + props.encode().len()
    }

    /// Publishes (mandatory) and, in confirm mode, waits for the broker's answer.
    pub async fn publish(
        &mut self,
        exchange: &str,
        routing_key: &str,
        props: &RawProperties,
        body: &[u8],
    ) -> Result<RawConfirm> {
        let mut method = Vec::new();
        method.extend(0u16.to_be_bytes());
        put_shortstr(&mut method, exchange);
        put_shortstr(&mut method, routing_key);
        method.push(1); // mandatory
        self.send_method(1, CLASS_BASIC, 40, &method).await?;
        let mut header = Vec::new();
        header.extend(CLASS_BASIC.to_be_bytes());
        header.extend(0u16.to_be_bytes());
        header.extend((body.len() as u64).to_be_bytes());
        header.extend(props.encode());
        self.send_frame(FRAME_HEADER, 1, &header).await?;
        let chunk = (self.frame_max as usize).saturating_sub(8).max(1);
        for part in body.chunks(chunk) {
            self.send_frame(FRAME_BODY, 1, part).await?;
        }
        if !self.confirm {
            return Ok(RawConfirm::Ack);
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        let mut returned = None;
        loop {
            let (class, method, args) = self.next_method(1).await?;
            let mut r = Reader::new(&args);
            match (class, method) {
                (CLASS_BASIC, 50) => {
                    let code = r.u16()?;
                    let text = r.shortstr()?;
                    self.read_content().await?;
                    returned = Some((code, text));
                }
                (CLASS_BASIC, 80) | (CLASS_BASIC, 120) => {
                    let acked = r.u64()?;
                    let multiple = r.u8()? & 1 == 1;
                    if acked == tag || (multiple && acked >= tag) {
                        return Ok(match (method, returned) {
                            (120, _) => RawConfirm::Nack,
                            (_, Some((code, text))) => RawConfirm::Returned(code, text),
                            _ => RawConfirm::Ack,
                        });
                    }
                }
                other => return err(format!("unexpected method {other:?} awaiting a confirm")),
            }
        }
    }

    /// Ready messages in `queue` (passive declare).
    pub async fn message_count(&mut self, queue: &str) -> Result<u32> {
        Ok(self.queue_counts(queue).await?.0)
    }

    /// Ready messages and consumers of `queue` (passive declare; a missing
    /// queue closes the channel and is an error).
    pub async fn queue_counts(&mut self, queue: &str) -> Result<(u32, u32)> {
        let mut declare = Vec::new();
        declare.extend(0u16.to_be_bytes());
        put_shortstr(&mut declare, queue);
        declare.push(1); // passive
        declare.extend(encode::table::<String>(&[]));
        self.send_method(1, 50, 10, &declare).await?;
        let ok = self.expect_method(1, 50, 11).await?;
        let mut r = Reader::new(&ok);
        r.shortstr()?;
        Ok((r.u32()?, r.u32()?))
    }

    /// Takes every ready message out of `queue` (consumed with auto-ack, so
    /// this is destructive) and returns them in queue order.
    pub async fn drain(&mut self, queue: &str) -> Result<Vec<RawMessage>> {
        let count = self.message_count(queue).await?;
        let mut out = Vec::with_capacity(count as usize);
        if count == 0 {
            return Ok(out);
        }
        let mut consume = Vec::new();
        consume.extend(0u16.to_be_bytes());
        put_shortstr(&mut consume, queue);
        put_shortstr(&mut consume, "sy-raw-drain");
        consume.push(0b10); // no-ack
        consume.extend(encode::table::<String>(&[]));
        self.send_method(1, CLASS_BASIC, 20, &consume).await?;
        self.expect_method(1, CLASS_BASIC, 21).await?;
        while out.len() < count as usize {
            let (class, method, _) = self.next_method(1).await?;
            if (class, method) != (CLASS_BASIC, 60) {
                return err(format!(
                    "unexpected method {class}.{method} draining {queue}"
                ));
            }
            out.push(self.read_content().await?);
        }
        let mut cancel = Vec::new();
        put_shortstr(&mut cancel, "sy-raw-drain");
        cancel.push(0);
        self.send_method(1, CLASS_BASIC, 30, &cancel).await?;
        self.expect_method(1, CLASS_BASIC, 31).await?;
        Ok(out)
    }

    /// Closes the connection politely.
    pub async fn close(mut self) {
        let mut close = Vec::new();
        close.extend(200u16.to_be_bytes());
        put_shortstr(&mut close, "OK");
        close.extend(0u32.to_be_bytes());
        if self.send_method(0, 10, 50, &close).await.is_ok() {
            let _ = self.expect_method(0, 10, 51).await;
        }
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.writer
            .write_all(bytes)
            .await
            .map_err(|e| RawError(format!("write: {e}")))
    }

    async fn send_frame(&mut self, kind: u8, channel: u16, payload: &[u8]) -> Result<()> {
        let mut frame = Vec::with_capacity(payload.len() + 8);
        frame.push(kind);
        frame.extend(channel.to_be_bytes());
        frame.extend((payload.len() as u32).to_be_bytes());
        frame.extend(payload);
        frame.push(FRAME_END);
        self.write(&frame).await
    }

    async fn send_method(
        &mut self,
        channel: u16,
        class: u16,
        method: u16,
        args: &[u8],
    ) -> Result<()> {
        let mut payload = Vec::with_capacity(args.len() + 4);
        payload.extend(class.to_be_bytes());
        payload.extend(method.to_be_bytes());
        payload.extend(args);
        self.send_frame(FRAME_METHOD, channel, &payload).await
    }

    /// The next frame other than a heartbeat: (type, channel, payload).
    async fn read_frame(&mut self) -> Result<(u8, u16, Vec<u8>)> {
        loop {
            let frame = tokio::time::timeout(ANSWER_TIMEOUT, async {
                let mut head = [0u8; 7];
                self.reader.read_exact(&mut head).await?;
                let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
                let mut payload = vec![0u8; size + 1];
                self.reader.read_exact(&mut payload).await?;
                Ok::<_, std::io::Error>((head, payload))
            })
            .await
            .map_err(|_| {
                RawError(format!(
                    "no frame from the broker within {ANSWER_TIMEOUT:?}"
                ))
            })?
            .map_err(|e| RawError(format!("read: {e}")))?;
            let (head, mut payload) = frame;
            if payload.pop() != Some(FRAME_END) {
                return err("frame without its end marker");
            }
            if head[0] == FRAME_HEARTBEAT {
                continue;
            }
            return Ok((head[0], u16::from_be_bytes([head[1], head[2]]), payload));
        }
    }

    /// The next method on `channel` (or on channel 0): (class, method, args).
    /// A close from the broker is answered and returned as an error.
    async fn next_method(&mut self, channel: u16) -> Result<(u16, u16, Vec<u8>)> {
        let (kind, ch, payload) = self.read_frame().await?;
        if kind != FRAME_METHOD {
            return err(format!("expected a method frame, got type {kind}"));
        }
        let mut r = Reader::new(&payload);
        let class = r.u16()?;
        let method = r.u16()?;
        let args = payload[4..].to_vec();
        if (class, method) == (10, 50) || (class, method) == (20, 40) {
            let code = r.u16()?;
            let text = r.shortstr()?;
            let (close_ok_class, close_ok_method) = if class == 10 { (10, 51) } else { (20, 41) };
            let _ = self
                .send_method(ch, close_ok_class, close_ok_method, &[])
                .await;
            return err(format!(
                "broker closed the {}: {code} {text}",
                if class == 10 { "connection" } else { "channel" }
            ));
        }
        if ch != channel && ch != 0 {
            return err(format!(
                "method {class}.{method} on unexpected channel {ch}"
            ));
        }
        Ok((class, method, args))
    }

    async fn expect_method(&mut self, channel: u16, class: u16, method: u16) -> Result<Vec<u8>> {
        let (c, m, args) = self.next_method(channel).await?;
        if (c, m) != (class, method) {
            return err(format!("expected method {class}.{method}, got {c}.{m}"));
        }
        Ok(args)
    }

    /// A content header and its body frames.
    async fn read_content(&mut self) -> Result<RawMessage> {
        let (kind, _, header) = self.read_frame().await?;
        if kind != FRAME_HEADER {
            return err(format!("expected a content header, got frame type {kind}"));
        }
        let mut r = Reader::new(&header);
        r.u16()?; // class
        r.u16()?; // weight
        let size = r.u64()? as usize;
        let flags = r.u16()?;
        if flags & 1 == 1 {
            return err("continued property flags are not supported");
        }
        let mut msg = RawMessage {
            message_id: None,
            delivery_mode: None,
            headers: None,
            body: Vec::with_capacity(size),
            short: Vec::new(),
        };
        for bit in (2u8..16).rev() {
            if flags & (1 << bit) == 0 {
                continue;
            }
            match bit {
                13 => msg.headers = Some(r.longstr()?.to_vec()),
                12 => msg.delivery_mode = Some(r.u8()?),
                11 => {
                    r.u8()?;
                }
                6 => {
                    r.u64()?;
                }
                _ => {
                    let n = r.u8()? as usize;
                    let bytes = r.take(n)?.to_vec();
                    if bit == 7 {
                        msg.message_id = Some(String::from_utf8_lossy(&bytes).into_owned());
                    }
                    if let Some(which) = Short::of_bit(bit) {
                        msg.short.push((which, bytes));
                    }
                }
            }
        }
        while msg.body.len() < size {
            let (kind, _, part) = self.read_frame().await?;
            if kind != FRAME_BODY {
                return err(format!("expected a body frame, got type {kind}"));
            }
            msg.body.extend(part);
        }
        Ok(msg)
    }
}
