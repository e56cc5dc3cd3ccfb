//! A minimal Redis (RESP2) client connection for the load generator: sends a pipeline of commands in one
//! write and reads one reply per command. Enough to drive Redis as a peer; not a general client.

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Longest bulk reply read; a larger one is treated as a broken connection.
const BULK_BYTES_MAX: usize = 1 << 20;

pub(crate) struct RedisConnection {
    stream: BufReader<TcpStream>,
    buffer: Vec<u8>,
    line: Vec<u8>,
}

/// How a pipeline ended when the connection itself was fine.
pub(crate) enum PipelineReply {
    Ok,
    /// At least one command answered with an error reply.
    Error,
}

impl RedisConnection {
    pub(crate) async fn connect(target: &str) -> std::io::Result<Self> {
        let stream = TcpStream::connect(target).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: BufReader::new(stream),
            buffer: Vec::new(),
            line: Vec::new(),
        })
    }

    pub(crate) async fn pipeline(
        &mut self,
        commands: &[Vec<Vec<u8>>],
    ) -> std::io::Result<PipelineReply> {
        self.buffer.clear();
        for command in commands {
            self.buffer
                .extend_from_slice(format!("*{}\r\n", command.len()).as_bytes());
            for argument in command {
                self.buffer
                    .extend_from_slice(format!("${}\r\n", argument.len()).as_bytes());
                self.buffer.extend_from_slice(argument);
                self.buffer.extend_from_slice(b"\r\n");
            }
        }
        self.stream.get_mut().write_all(&self.buffer).await?;
        let mut failed = false;
        for _ in commands {
            failed |= !self.read_reply().await?;
        }
        Ok(if failed {
            PipelineReply::Error
        } else {
            PipelineReply::Ok
        })
    }

    /// Reads one reply; false when it was an error reply.
    async fn read_reply(&mut self) -> std::io::Result<bool> {
        let mut pending = 1usize;
        let mut ok = true;
        while pending > 0 {
            pending -= 1;
            self.line.clear();
            self.stream.read_until(b'\n', &mut self.line).await?;
            let Some((&kind, rest)) = self.line.split_first() else {
                return Err(broken("connection closed"));
            };
            let number = || -> std::io::Result<i64> {
                std::str::from_utf8(rest)
                    .ok()
                    .and_then(|t| t.trim_end().parse().ok())
                    .ok_or_else(|| broken("malformed length"))
            };
            match kind {
                b'+' | b':' => {}
                b'-' => ok = false,
                b'$' => {
                    let len = number()?;
                    if len >= 0 {
                        let len = usize::try_from(len).map_err(|_| broken("bulk length"))?;
                        if len > BULK_BYTES_MAX {
                            return Err(broken("bulk reply too large"));
                        }
                        let mut skip = vec![0; len + 2];
                        self.stream.read_exact(&mut skip).await?;
                    }
                }
                b'*' => {
                    pending +=
                        usize::try_from(number()?.max(0)).map_err(|_| broken("array length"))?
                }
                _ => return Err(broken("unknown reply type")),
            }
        }
        Ok(ok)
    }
}

fn broken(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("redis protocol: {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// A peer that checks the request bytes it gets and answers with canned replies.
    async fn peer(expected_request: &'static [u8], replies: &'static [u8]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = vec![0; expected_request.len()];
            socket.read_exact(&mut request).await.unwrap();
            assert_eq!(request, expected_request);
            socket.write_all(replies).await.unwrap();
        });
        address
    }

    fn command(args: &[&str]) -> Vec<Vec<u8>> {
        args.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    #[tokio::test]
    async fn a_pipeline_reads_one_reply_of_any_type_per_command() {
        let address = peer(
            b"*4\r\n$7\r\nZINCRBY\r\n$1\r\nb\r\n$1\r\n5\r\n$1\r\nm\r\n*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n",
            b"$1\r\n5\r\n+PONG\r\n*3\r\n$1\r\na\r\n:1\r\n*1\r\n$-1\r\n:7\r\n",
        )
        .await;
        let mut connection = RedisConnection::connect(&address).await.unwrap();
        let commands = [
            command(&["ZINCRBY", "b", "5", "m"]),
            command(&["PING"]),
            command(&["PING"]),
            command(&["PING"]),
        ];
        let reply = connection.pipeline(&commands).await.unwrap();
        assert!(matches!(reply, PipelineReply::Ok));
    }

    #[tokio::test]
    async fn an_error_reply_is_reported_and_a_closed_connection_is_an_error() {
        let address = peer(
            b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n",
            b"-ERR wrong\r\n+PONG\r\n",
        )
        .await;
        let mut connection = RedisConnection::connect(&address).await.unwrap();
        let reply = connection
            .pipeline(&[command(&["PING"]), command(&["PING"])])
            .await
            .unwrap();
        assert!(matches!(reply, PipelineReply::Error));
        // The peer has closed: the next reply never comes.
        assert!(connection.pipeline(&[command(&["PING"])]).await.is_err());
    }
}
