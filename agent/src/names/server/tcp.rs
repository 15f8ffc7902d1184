//! Service names over TCP (RFC 7766): Docker's resolver asks over TCP when its client did, which
//! a client does after a truncated UDP answer. Each message is a two-byte length and the
//! message; a connection is answered for at most [`QUERIES_PER_CONNECTION`] queries, each read
//! within [`READ_TIMEOUT`], and at most [`MAX_CONNECTIONS`] connections are open per
//! environment. Names outside `.internal` are relayed to the host's resolver over TCP too.

use super::{FORWARD_TIMEOUT, Table};
use crate::names::{self, MAX_QUERY, Reply};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Open connections per environment; more are closed at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Queries one connection may ask before it is closed.
pub const QUERIES_PER_CONNECTION: usize = 16;
/// How long a connection may take to send its next query.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// One length-prefixed message from `stream` (`None`: closed, too large, or too slow).
async fn read_message(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 2];
    tokio::time::timeout(READ_TIMEOUT, stream.read_exact(&mut len))
        .await
        .ok()?
        .ok()?;
    let len = usize::from(u16::from_be_bytes(len));
    if len == 0 || len > MAX_QUERY {
        return None;
    }
    let mut message = vec![0u8; len];
    tokio::time::timeout(READ_TIMEOUT, stream.read_exact(&mut message))
        .await
        .ok()?
        .ok()?;
    Some(message)
}

async fn write_message(stream: &mut TcpStream, message: &[u8]) -> Option<()> {
    let len = u16::try_from(message.len()).ok()?.to_be_bytes();
    stream.write_all(&len).await.ok()?;
    stream.write_all(message).await.ok()
}

/// The host resolver's reply to `query` over TCP (`None`: none in time).
async fn forward(query: &[u8], to: SocketAddr) -> Option<Vec<u8>> {
    tokio::time::timeout(FORWARD_TIMEOUT, async {
        let mut stream = TcpStream::connect(to).await.ok()?;
        write_message(&mut stream, query).await?;
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).await.ok()?;
        let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut reply).await.ok()?;
        // The reply must answer this query (same id), or it is not relayed.
        (reply.len() >= 2 && reply[..2] == query[..2]).then_some(reply)
    })
    .await
    .ok()?
}

/// One environment's TCP server loop.
pub(super) async fn serve(
    listener: TcpListener,
    environment: Arc<str>,
    subnet: Arc<str>,
    table: Table,
    upstream: Option<SocketAddr>,
) {
    let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((mut stream, from)) = listener.accept().await else {
            continue;
        };
        let SocketAddr::V4(v4) = from else { continue };
        if !names::within(&subnet, *v4.ip()) {
            continue; // dropped: another environment learns nothing
        }
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            continue;
        };
        let (environment, table) = (Arc::clone(&environment), Arc::clone(&table));
        tokio::spawn(async move {
            let _permit = permit;
            for _ in 0..QUERIES_PER_CONNECTION {
                let Some(query) = read_message(&mut stream).await else {
                    return;
                };
                let answer = match super::answer(&table, &environment, &query) {
                    Reply::Answer(bytes) => Some(bytes),
                    Reply::Forward => match upstream {
                        Some(to) => forward(&query, to).await,
                        None => None,
                    },
                    Reply::Drop => None,
                };
                let Some(answer) = answer else { return };
                if write_message(&mut stream, &answer).await.is_none() {
                    return;
                }
            }
        });
    }
}
