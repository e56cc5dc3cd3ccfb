//! A keep-alive HTTP/1.1 client connection for the load generator: a request is encoded into a buffer
//! the connection keeps and written at once; its reply's head is parsed with `httparse` and its body
//! counted off as it arrives, not kept (the runner needs the status and the moment the last byte came).
//! The load generator shares the cores with the server it measures, so the CPU it spends per request is
//! CPU the server lacks: hyper's client, with a request and a response object, a header map and a
//! channel to its connection task per exchange, cost more per request than this (BENCHMARKS.md, "The
//! load generator's own HTTP client").
//!
//! Framing follows RFC 9112 section 6.3: no body for 1xx, 204, 304 or a HEAD request; `chunked` when it
//! is the last transfer coding; else `content-length`; else the body runs to the end of the connection.

use crate::HttpRequest;
use std::io::{self, Write};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Most bytes of a reply's status line and headers, and of a chunk's size line or a trailer.
const REPLY_HEAD_BYTES_MAX: usize = 64 * 1024;

/// Most headers a reply may carry.
const REPLY_HEADERS_MAX: usize = 64;

/// What one `read` asks for at most; a body larger than this streams through the buffer.
const READ_BYTES: usize = 16 * 1024;

/// Why an exchange failed; the connection is not used again after any of them.
#[derive(Debug)]
pub(crate) enum ExchangeError {
    Io,
    /// The server closed the connection before the reply was whole.
    Closed,
    /// The reply is not HTTP/1.x as this client reads it.
    Malformed,
    /// The request cannot be written as HTTP/1.1 (a space or a control character in its path, a line
    /// break in a header).
    Unsendable,
}

impl From<io::Error> for ExchangeError {
    fn from(_: io::Error) -> Self {
        Self::Io
    }
}

/// How a reply's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// A reply's status line and headers, as much as the client acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    status: u16,
    head_bytes: usize,
    framing: Framing,
    /// The server closes the connection after this reply.
    closes: bool,
}

pub(crate) struct HttpConnection {
    stream: TcpStream,
    /// The request being sent, encoded into the same allocation each time.
    request: Vec<u8>,
    /// Bytes read and not yet consumed are `read[start..end]`.
    read: Vec<u8>,
    start: usize,
    end: usize,
    closed: bool,
}

impl HttpConnection {
    pub(crate) async fn connect(target: &str) -> io::Result<Self> {
        let stream = TcpStream::connect(target).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            request: Vec::new(),
            read: vec![0; READ_BYTES],
            start: 0,
            end: 0,
            closed: false,
        })
    }

    /// The server said it closes the connection, or closed it.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// Sends `request` to `host` and reads the whole reply; returns its status.
    pub(crate) async fn exchange(
        &mut self,
        host: &str,
        request: &HttpRequest,
    ) -> Result<u16, ExchangeError> {
        encode(&mut self.request, host, request)?;
        self.stream.write_all(&self.request).await?;
        let head_request = request.method == http::Method::HEAD;
        loop {
            let head = self.read_head(head_request).await?;
            self.start += head.head_bytes;
            self.closed |= head.closes;
            match head.framing {
                Framing::None => {}
                Framing::Length(bytes) => self.skip(bytes).await?,
                Framing::Chunked => self.skip_chunks().await?,
                Framing::UntilClose => {
                    self.skip_to_close().await?;
                    self.closed = true;
                }
            }
            // An interim reply (100 Continue) precedes the final one.
            if (100..200).contains(&head.status) {
                continue;
            }
            // Nothing was asked after this request: bytes beyond its reply are a server's error,
            // which would otherwise pass for the next request's reply.
            if self.start != self.end {
                self.closed = true;
                return Err(ExchangeError::Malformed);
            }
            return Ok(head.status);
        }
    }

    async fn read_head(&mut self, head_request: bool) -> Result<Head, ExchangeError> {
        loop {
            if let Some(head) = parse_head(&self.read[self.start..self.end], head_request)? {
                return Ok(head);
            }
            if self.end - self.start >= REPLY_HEAD_BYTES_MAX {
                return Err(ExchangeError::Malformed);
            }
            self.fill().await?;
        }
    }

    /// Reads more bytes after those not consumed yet, moving them to the front or growing the buffer
    /// when there is no room behind them.
    async fn fill(&mut self) -> Result<(), ExchangeError> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
        if self.end == self.read.len() {
            self.read.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
            if self.end == self.read.len() {
                self.read.resize(self.read.len() * 2, 0);
            }
        }
        let room = (self.read.len() - self.end).min(READ_BYTES);
        let read = self
            .stream
            .read(&mut self.read[self.end..self.end + room])
            .await?;
        if read == 0 {
            self.closed = true;
            return Err(ExchangeError::Closed);
        }
        self.end += read;
        Ok(())
    }

    /// Consumes `bytes` bytes of body.
    async fn skip(&mut self, mut bytes: u64) -> Result<(), ExchangeError> {
        loop {
            let here = (self.end - self.start).min(usize::try_from(bytes).unwrap_or(usize::MAX));
            self.start += here;
            bytes -= here as u64;
            if bytes == 0 {
                return Ok(());
            }
            self.fill().await?;
        }
    }

    /// Consumes a chunked body: chunks up to the last (size 0), then its trailer lines and the empty
    /// line that ends them.
    async fn skip_chunks(&mut self) -> Result<(), ExchangeError> {
        loop {
            let (size_line_bytes, size) = loop {
                let unread = &self.read[self.start..self.end];
                // `parse_chunk_size` takes a line without digits for a size of 0.
                if unread.first().is_some_and(|byte| !byte.is_ascii_hexdigit()) {
                    return Err(ExchangeError::Malformed);
                }
                match httparse::parse_chunk_size(unread) {
                    Ok(httparse::Status::Complete(parsed)) => break parsed,
                    Ok(httparse::Status::Partial) => {}
                    Err(httparse::InvalidChunkSize) => {
                        return Err(ExchangeError::Malformed);
                    }
                }
                if self.end - self.start >= REPLY_HEAD_BYTES_MAX {
                    return Err(ExchangeError::Malformed);
                }
                self.fill().await?;
            };
            self.start += size_line_bytes;
            if size == 0 {
                return self.skip_trailers().await;
            }
            self.skip(size).await?;
            self.expect_line_end().await?;
        }
    }

    async fn skip_trailers(&mut self) -> Result<(), ExchangeError> {
        loop {
            let line_bytes = self.line().await?;
            self.start += line_bytes;
            if line_bytes == 2 {
                return Ok(());
            }
        }
    }

    /// The length of the next line, its CRLF included, once it is all in the buffer.
    async fn line(&mut self) -> Result<usize, ExchangeError> {
        loop {
            let unread = &self.read[self.start..self.end];
            if let Some(at) = unread.iter().position(|&byte| byte == b'\n') {
                if at == 0 || unread[at - 1] != b'\r' {
                    return Err(ExchangeError::Malformed);
                }
                return Ok(at + 1);
            }
            if unread.len() >= REPLY_HEAD_BYTES_MAX {
                return Err(ExchangeError::Malformed);
            }
            self.fill().await?;
        }
    }

    async fn expect_line_end(&mut self) -> Result<(), ExchangeError> {
        while self.end - self.start < 2 {
            self.fill().await?;
        }
        if &self.read[self.start..self.start + 2] != b"\r\n" {
            return Err(ExchangeError::Malformed);
        }
        self.start += 2;
        Ok(())
    }

    async fn skip_to_close(&mut self) -> Result<(), ExchangeError> {
        self.start = self.end;
        loop {
            match self.fill().await {
                Ok(()) => self.start = self.end,
                Err(ExchangeError::Closed) => return Ok(()),
                Err(error) => return Err(error),
            }
        }
    }
}

/// Writes `request` as HTTP/1.1 into `out`, replacing what it held.
fn encode(out: &mut Vec<u8>, host: &str, request: &HttpRequest) -> Result<(), ExchangeError> {
    // A path of visible ASCII; header names that are tokens and not the two written here; values
    // without control characters but tab.
    let path_is_sendable =
        !request.path.is_empty() && request.path.bytes().all(|byte| byte.is_ascii_graphic());
    let value_is_sendable =
        |text: &str| (text.bytes()).all(|byte| byte == b'\t' || !byte.is_ascii_control());
    let name_is_sendable = |name: &str| {
        !name.is_empty()
            && (name.bytes())
                .all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
            && !name.eq_ignore_ascii_case("host")
            && !name.eq_ignore_ascii_case("content-length")
    };
    if !path_is_sendable
        || !value_is_sendable(host)
        || !(request.headers.iter())
            .all(|(name, value)| name_is_sendable(name) && value_is_sendable(value))
    {
        return Err(ExchangeError::Unsendable);
    }
    out.clear();
    out.extend_from_slice(request.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(request.path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &request.headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let method_has_body = !matches!(
        request.method,
        http::Method::GET | http::Method::HEAD | http::Method::DELETE | http::Method::OPTIONS
    );
    if method_has_body || !request.body.is_empty() {
        write!(out, "content-length: {}\r\n", request.body.len()).expect("writes to a Vec");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&request.body);
    Ok(())
}

/// The reply's head if `unread` holds all of it.
fn parse_head(unread: &[u8], head_request: bool) -> Result<Option<Head>, ExchangeError> {
    let mut headers = [httparse::EMPTY_HEADER; REPLY_HEADERS_MAX];
    let mut reply = httparse::Response::new(&mut headers);
    let head_bytes = match reply.parse(unread) {
        Ok(httparse::Status::Complete(bytes)) => bytes,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(ExchangeError::Malformed),
    };
    let status = reply.code.expect("a complete head has a status");
    if status < 100 {
        return Err(ExchangeError::Malformed);
    }
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut transfer_coded = false;
    let mut closes = reply.version == Some(0);
    for header in reply.headers.iter() {
        let value = std::str::from_utf8(header.value).map_err(|_| ExchangeError::Malformed);
        if header.name.eq_ignore_ascii_case("content-length") {
            // Digits only: `u64::from_str` would also take a leading `+`.
            let digits = value?.trim_matches([' ', '\t']);
            if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
                return Err(ExchangeError::Malformed);
            }
            let parsed = (digits.parse::<u64>()).map_err(|_| ExchangeError::Malformed)?;
            if length.is_some_and(|earlier| earlier != parsed) {
                return Err(ExchangeError::Malformed);
            }
            length = Some(parsed);
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_coded = true;
            chunked = (value?.rsplit(','))
                .map(str::trim)
                .find(|coding| !coding.is_empty())
                .is_some_and(|last| last.eq_ignore_ascii_case("chunked"));
        } else if header.name.eq_ignore_ascii_case("connection") {
            for token in value?.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    closes = true;
                } else if token.eq_ignore_ascii_case("keep-alive") && reply.version == Some(0) {
                    closes = false;
                }
            }
        }
    }
    // RFC 9112 section 6.1: a transfer coding in an HTTP/1.0 message is faulty framing.
    if transfer_coded && reply.version == Some(0) {
        return Err(ExchangeError::Malformed);
    }
    let framing = if head_request || (100..200).contains(&status) || matches!(status, 204 | 304) {
        Framing::None
    } else if transfer_coded {
        if chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else {
        match length {
            Some(0) => Framing::None,
            Some(bytes) => Framing::Length(bytes),
            None => Framing::UntilClose,
        }
    };
    Ok(Some(Head {
        status,
        head_bytes,
        framing,
        closes: closes || framing == Framing::UntilClose,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tokio::net::TcpListener;

    fn request(method: http::Method, path: &str, body: &'static [u8]) -> HttpRequest {
        HttpRequest {
            method,
            path: path.into(),
            body: Bytes::from_static(body),
            headers: vec![("content-type", "application/json".into())],
            also_ok: &[],
        }
    }

    #[test]
    fn a_request_is_encoded_as_http_1_1_with_its_length() {
        let mut out = Vec::new();
        encode(
            &mut out,
            "127.0.0.1:1",
            &request(http::Method::POST, "/a?b=c", b"{}"),
        )
        .unwrap();
        assert_eq!(
            out,
            b"POST /a?b=c HTTP/1.1\r\nhost: 127.0.0.1:1\r\ncontent-type: application/json\r\n\
              content-length: 2\r\n\r\n{}"
        );
        encode(&mut out, "h", &request(http::Method::GET, "/health", b"")).unwrap();
        assert_eq!(
            out,
            b"GET /health HTTP/1.1\r\nhost: h\r\ncontent-type: application/json\r\n\r\n"
        );
        encode(&mut out, "h", &request(http::Method::PUT, "/x", b"")).unwrap();
        assert!(out.ends_with(b"content-length: 0\r\n\r\n"));
    }

    #[test]
    fn a_request_that_http_cannot_carry_is_refused() {
        let mut out = Vec::new();
        for path in ["", "/a b", "/a\r\nx: y"] {
            assert!(matches!(
                encode(&mut out, "h", &request(http::Method::GET, path, b"")),
                Err(ExchangeError::Unsendable)
            ));
        }
        for path in ["/caf\u{e9}", "/\t"] {
            assert!(matches!(
                encode(&mut out, "h", &request(http::Method::GET, path, b"")),
                Err(ExchangeError::Unsendable)
            ));
        }
        for (name, value) in [
            ("x", "a\r\nb: c"),
            ("x", "a\0b"),
            ("x y", "1"),
            ("x:", "1"),
            ("", "1"),
            ("Host", "elsewhere"),
            ("content-length", "5"),
        ] {
            let mut refused = request(http::Method::GET, "/", b"");
            refused.headers.push((name, value.into()));
            assert!(
                matches!(
                    encode(&mut out, "h", &refused),
                    Err(ExchangeError::Unsendable)
                ),
                "{name:?}: {value:?}"
            );
        }
        let mut tabbed = request(http::Method::GET, "/", b"");
        tabbed.headers.push(("x-tab", "a\tb".into()));
        assert!(encode(&mut out, "h", &tabbed).is_ok());
    }

    #[test]
    fn a_head_is_framed_by_its_headers() {
        // (head, a reply to HEAD, then status, framing and whether the connection closes after it)
        let cases = [
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n",
                false,
                Some((200, Framing::Length(12), false)),
            ),
            ("HTTP/1.1 200 OK\r\nContent-Len", false, None),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, Chunked\r\ncontent-length: 5\r\n\r\n",
                false,
                Some((200, Framing::Chunked, false)),
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked,\r\n\r\n",
                false,
                Some((200, Framing::Chunked, false)),
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                false,
                Some((200, Framing::UntilClose, true)),
            ),
            (
                "HTTP/1.1 200 OK\r\n\r\n",
                false,
                Some((200, Framing::UntilClose, true)),
            ),
            (
                "HTTP/1.1 204 No Content\r\n\r\n",
                false,
                Some((204, Framing::None, false)),
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n",
                true,
                Some((200, Framing::None, false)),
            ),
            (
                "HTTP/1.1 503 Busy\r\nConnection: close\r\ncontent-length: 0\r\n\r\n",
                false,
                Some((503, Framing::None, true)),
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n",
                false,
                Some((200, Framing::Length(1), true)),
            ),
            (
                "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n",
                false,
                Some((200, Framing::Length(1), false)),
            ),
        ];
        for (head, head_request, expected) in cases {
            let parsed = parse_head(head.as_bytes(), head_request).unwrap();
            let framed = parsed.map(|head| (head.status, head.framing, head.closes));
            assert_eq!(framed, expected, "{head:?}");
        }
        for bad in [
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: +1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
            "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            "HTTP/1.1 099 Early\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "SPDY 200 OK\r\n\r\n",
        ] {
            assert!(parse_head(bad.as_bytes(), false).is_err(), "{bad:?}");
        }
    }

    /// A server that reads one request (its head, then `content-length` bytes) per reply and writes
    /// each reply in the pieces given, with a pause between them so that they arrive in separate reads.
    async fn serve(replies: Vec<Vec<&'static [u8]>>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut received = Vec::new();
            for pieces in replies {
                loop {
                    if let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&received[..end]).to_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|line| line.strip_prefix("content-length: "))
                            .map_or(0, |value| value.parse().unwrap());
                        if received.len() >= end + 4 + length {
                            received.drain(..end + 4 + length);
                            break;
                        }
                    }
                    let mut buffer = [0u8; 1024];
                    let read = stream.read(&mut buffer).await.unwrap();
                    if read == 0 {
                        return;
                    }
                    received.extend_from_slice(&buffer[..read]);
                }
                for piece in pieces {
                    stream.write_all(piece).await.unwrap();
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
        });
        address
    }

    #[tokio::test]
    async fn replies_in_pieces_are_read_whole_and_the_connection_kept() {
        let big_body: &'static [u8] = Box::leak(vec![b'x'; 3 * READ_BYTES + 5].into_boxed_slice());
        let big_head: &'static [u8] = Box::leak(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
                big_body.len()
            )
            .into_bytes()
            .into_boxed_slice(),
        );
        // A head larger than the read buffer, after an interim reply already consumed from it: the
        // unread bytes move to the front, then the buffer grows.
        let long_value = "v".repeat(READ_BYTES);
        let long_head_start: &'static [u8] = Box::leak(
            format!(
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nx-long: {}",
                &long_value[..READ_BYTES / 2]
            )
            .into_bytes()
            .into_boxed_slice(),
        );
        let long_head_end: &'static [u8] = Box::leak(
            format!(
                "{}\r\ncontent-length: 0\r\n\r\n",
                &long_value[READ_BYTES / 2..]
            )
            .into_bytes()
            .into_boxed_slice(),
        );
        let target = serve(vec![
            vec![b"HTTP/1.1 201 Created\r\ncontent-", b"length: 4\r\n\r\nab", b"cd"],
            vec![
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                b"3\r\nabc\r\n1",
                b"0;ext=1\r\n0123456789abcdef\r",
                b"\n0\r\ntrailer: 1\r\n",
                b"\r\n",
            ],
            vec![big_head, big_body],
            vec![long_head_start, long_head_end],
            vec![b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"],
        ])
        .await;
        let mut connection = HttpConnection::connect(&target).await.unwrap();
        let post = request(http::Method::POST, "/a", b"{\"a\":1}");
        let mut statuses = Vec::new();
        for _ in 0..5 {
            // A framing error may wait for bytes that never come: fail instead of hanging.
            let exchange = connection.exchange(&target, &post);
            let status = tokio::time::timeout(std::time::Duration::from_secs(5), exchange).await;
            statuses.push(status.expect("the reply in time").unwrap());
            assert!(!connection.is_closed());
            assert_eq!(connection.start, connection.end, "nothing left over");
        }
        assert_eq!(statuses, [201, 200, 200, 202, 404]);
    }

    #[tokio::test]
    async fn a_reply_cut_short_or_malformed_fails_and_a_closing_one_closes() {
        let target = serve(vec![vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",
        ]])
        .await;
        let mut connection = HttpConnection::connect(&target).await.unwrap();
        let get = request(http::Method::GET, "/", b"");
        assert!(matches!(
            connection.exchange(&target, &get).await,
            Err(ExchangeError::Closed)
        ));
        assert!(connection.is_closed());

        for malformed in [
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcX\r\n".as_slice(),
            // A chunk's data not followed by CRLF, and a size line without digits.
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\r\n",
            // More than the reply: it would pass for the next request's.
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nabcd",
        ] {
            let target = serve(vec![vec![malformed]]).await;
            let mut connection = HttpConnection::connect(&target).await.unwrap();
            assert!(
                matches!(
                    connection.exchange(&target, &get).await,
                    Err(ExchangeError::Malformed)
                ),
                "{}",
                String::from_utf8_lossy(malformed)
            );
        }

        let target = serve(vec![vec![b"HTTP/1.1 200 OK\r\n\r\nuntil the end"]]).await;
        let mut connection = HttpConnection::connect(&target).await.unwrap();
        assert_eq!(connection.exchange(&target, &get).await.unwrap(), 200);
        assert!(connection.is_closed());
    }
}
