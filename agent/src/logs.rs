//! `pl logs` on the node: the agent waits for its node's log requests (long polling the
//! control plane, which relays them from readers), reads the containers of the asked role
//! from the engine (their tails, then new lines when following) and posts the lines back in
//! pieces of at most `MAX_LOG_CHUNK_BYTES`, each line prefixed by its replica. A stream ends
//! when the containers' logs end, or when the control plane says its reader left. Lines are
//! relayed, never logged or kept.

use crate::client::{AgentClient, ClientError};
use crate::docker::{CONTROL_PLANE, ENVIRONMENT, GENERATION, INSTANCE, NODE, OWNED, ROLE};
use agent_proto::{LogRequest, MAX_LOG_CHUNK_BYTES, MAX_LOG_LINE_BYTES, MAX_LOG_TAIL_BYTES, MAX_LOG_WAIT_MS, Refusal};
use bollard::Docker;
use futures_util::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often buffered lines go out.
const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// How often a quiet followed stream asks whether its reader is still there.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(5);

/// Whose containers a node's log requests read: this control plane's, on this node. Two
/// control planes on one machine may both have a node `n1` and an environment `web-production`.
#[derive(Clone, Debug)]
pub struct Scope {
    pub control_plane: String,
    pub node: String,
}

impl Scope {
    /// Docker's label filter for `environment`'s `role` within the scope.
    fn filter(&self, environment: &str, role: &str) -> HashMap<String, Vec<String>> {
        HashMap::from([(
            "label".to_owned(),
            vec![
                format!("{OWNED}=true"),
                format!("{CONTROL_PLANE}={}", self.control_plane),
                format!("{NODE}={}", self.node),
                format!("{ENVIRONMENT}={environment}"),
                format!("{ROLE}={role}"),
            ],
        )])
    }
}

/// Serves this node's log requests until the process ends.
pub async fn serve(client: Arc<AgentClient>, docker: Docker, scope: Scope) {
    loop {
        let c = Arc::clone(&client);
        let got = tokio::task::spawn_blocking(move || c.log_wait(Duration::from_millis(MAX_LOG_WAIT_MS)))
            .await
            .unwrap_or_else(|e| Err(ClientError::Transport(e.to_string())));
        match got {
            Ok(requests) => {
                for request in requests {
                    tokio::spawn(stream(Arc::clone(&client), docker.clone(), scope.clone(), request));
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "waiting for log requests failed");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

/// Posts a piece; false when the stream is over (its reader left, or the control plane is
/// gone).
async fn post(client: &Arc<AgentClient>, id: &str, lines: Vec<u8>, done: bool) -> bool {
    let (c, id) = (Arc::clone(client), id.to_owned());
    let sent = tokio::task::spawn_blocking(move || c.log_chunk(&id, &lines, done))
        .await
        .unwrap_or_else(|e| Err(ClientError::Transport(e.to_string())));
    match sent {
        Ok(()) => true,
        Err(ClientError::Refused {
            code: Refusal::LogStreamGone,
            ..
        }) => false,
        Err(e) => {
            tracing::debug!(error = %e, "posting log lines failed");
            false
        }
    }
}

/// Appends `line` with its prefix, cut to [`MAX_LOG_LINE_BYTES`] (and to fit one piece).
fn push_line(buf: &mut Vec<u8>, prefix: &str, line: &[u8]) {
    let room = MAX_LOG_CHUNK_BYTES
        .saturating_sub(prefix.len() + 4)
        .min(MAX_LOG_LINE_BYTES);
    buf.extend_from_slice(prefix.as_bytes());
    buf.extend_from_slice(b" | ");
    buf.extend_from_slice(&line[..line.len().min(room)]);
    buf.push(b'\n');
}

/// One request: the role's containers on this node, their lines merged as they come.
async fn stream(client: Arc<AgentClient>, docker: Docker, scope: Scope, request: LogRequest) {
    use bollard::query_parameters::{ListContainersOptionsBuilder, LogsOptionsBuilder};
    let filters = scope.filter(&request.environment, &request.role);
    let listed = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await;
    let mut containers: Vec<(String, String)> = match listed {
        Ok(list) => list
            .into_iter()
            .filter_map(|c| {
                let name = c.names?.into_iter().next()?.trim_start_matches('/').to_owned();
                let labels = c.labels.unwrap_or_default();
                let generation = labels.get(GENERATION).cloned().unwrap_or_default();
                let prefix = match labels.get(INSTANCE) {
                    Some(i) => format!("{}/{i} g{generation}", request.role),
                    None => format!("{} g{generation}", request.role),
                };
                Some((name, prefix))
            })
            .collect(),
        Err(e) => {
            let line = format!("pushleft: the engine did not list the containers: {e}\n");
            post(&client, &request.id, line.into_bytes(), true).await;
            return;
        }
    };
    containers.sort();
    if containers.is_empty() {
        let line = format!(
            "pushleft: no container of {}/{} on this node\n",
            request.environment, request.role
        );
        post(&client, &request.id, line.into_bytes(), true).await;
        return;
    }
    let tail = request.tail.to_string();
    let streams = containers.into_iter().map(|(name, prefix)| {
        let options = LogsOptionsBuilder::default()
            .follow(request.follow)
            .stdout(true)
            .stderr(true)
            .tail(&tail)
            .build();
        docker
            .logs(&name, Some(options))
            .map(move |item| (prefix.clone(), item))
    });
    let mut merged = futures_util::stream::select_all(streams);
    let mut buf: Vec<u8> = Vec::new();
    // What a request that does not follow has relayed: bounded by MAX_LOG_TAIL_BYTES.
    let mut relayed = 0usize;
    let mut last_post = Instant::now();
    let mut ticker = tokio::time::interval(FLUSH_EVERY);
    loop {
        tokio::select! {
            item = merged.next() => match item {
                Some((prefix, Ok(output))) => {
                    let bytes = output.into_bytes();
                    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                        if buf.len() + prefix.len() + line.len().min(MAX_LOG_LINE_BYTES) + 4 > MAX_LOG_CHUNK_BYTES {
                            relayed += buf.len();
                            if !post(&client, &request.id, std::mem::take(&mut buf), false).await {
                                return;
                            }
                            last_post = Instant::now();
                        }
                        if !request.follow && relayed + buf.len() >= MAX_LOG_TAIL_BYTES {
                            let note = format!("pushleft: stopped after {} MiB, the bound of a log request that does not follow\n", MAX_LOG_TAIL_BYTES >> 20);
                            buf.extend_from_slice(note.as_bytes());
                            post(&client, &request.id, buf, true).await;
                            return;
                        }
                        push_line(&mut buf, &prefix, line);
                    }
                }
                Some((prefix, Err(e))) => {
                    push_line(&mut buf, &prefix, format!("pushleft: reading the log: {e}").as_bytes());
                }
                None => break,
            },
            _ = ticker.tick() => {
                if !buf.is_empty() || last_post.elapsed() >= KEEPALIVE_EVERY {
                    if !post(&client, &request.id, std::mem::take(&mut buf), false).await {
                        return;
                    }
                    last_post = Instant::now();
                }
            }
        }
    }
    post(&client, &request.id, buf, true).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_longer_than_a_piece_is_cut_to_fit() {
        let mut buf = Vec::new();
        push_line(&mut buf, "web/0 g3", &vec![b'x'; MAX_LOG_CHUNK_BYTES * 2]);
        assert!(buf.len() <= MAX_LOG_LINE_BYTES + 16, "{}", buf.len());
        assert!(buf.starts_with(b"web/0 g3 | xxx"));
        assert_eq!(buf.last(), Some(&b'\n'));
    }
}
