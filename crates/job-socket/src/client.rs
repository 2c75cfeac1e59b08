//! The job's side: a small async client SDK for the job socket.
//!
//! ```no_run
//! # async fn demo() -> Result<(), job_socket::client::ClientError> {
//! use job_socket::client::connect_migration;
//! use job_socket::frame::{TargetApplied, WorkerToJob};
//! use job_socket::json::Json;
//! let mut socket = connect_migration().await?; // no-op when the env names are absent
//! if let Some(migration_id) = socket.target_of() {
//!     // Launched as a handover target: `initial-state` is the next event.
//! }
//! while let Some(frame) = socket.next_event().await? {
//!     match frame {
//!         WorkerToJob::GetState { .. } => socket.send_state(Json::Null).await?,
//!         WorkerToJob::InitialState { payload, .. } => socket.target_ready(Json::Null).await?,
//!         WorkerToJob::CutoverReady { .. } => socket.source_stopped_output(Json::Null).await?,
//!         WorkerToJob::CutoverApply { .. } => socket.target_applied(TargetApplied::default()).await?,
//!         WorkerToJob::Abort { .. } | WorkerToJob::HelloAck { .. } => {}
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Choices: [`connect_migration`] with either env name absent returns a disabled client whose
//! sends succeed and do nothing and whose [`MigrationClient::next_event`] returns `Ok(None)` at
//! once (no migration will ever come). The client does not track phases — the worker enforces
//! them and closes with 4400 — but it does validate what the worker sends with the same parser
//! the reference client uses, and refuses to send a frame over the 64 KiB cap instead of being
//! closed for it.

use crate::consts::{
    JOB_SOCKET_ENV_TOKEN, JOB_SOCKET_ENV_URL, JOB_SOCKET_HELLO_TIMEOUT, JOB_SOCKET_MAX_FRAME_BYTES,
};
use crate::frame::{JobToWorker, TargetApplied, WorkerToJob, parse_worker_to_job};
use crate::json::Json;
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode as WsCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Client failures.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Could not connect or upgrade.
    #[error("connecting to {url}: {source}")]
    Connect {
        /// The URL.
        url: String,
        /// The WebSocket error.
        source: Box<WsError>,
    },
    /// The worker did not answer `hello` in time.
    #[error("no hello-ack within the hello timeout")]
    HelloTimeout,
    /// The worker closed the socket (4401 wrong token, 4400 protocol error, 4409 replaced, …).
    #[error("worker closed the socket ({code:?}): {reason}")]
    Closed {
        /// The close code, if one was sent.
        code: Option<u16>,
        /// The close reason.
        reason: String,
    },
    /// The worker sent a frame the contract does not allow; the client closed with 4400.
    #[error("worker sent an invalid frame: {0}")]
    Protocol(String),
    /// A frame would exceed 64 KiB.
    #[error("frame of {0} bytes exceeds the 64 KiB cap")]
    FrameTooLarge(usize),
    /// Transport failure.
    #[error("job socket transport: {0}")]
    Transport(Box<WsError>),
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A job's connection to its worker's migration socket (or the disabled no-op client).
pub struct MigrationClient {
    ws: Option<Ws>,
    target_of: Option<String>,
    closed: bool,
}

/// Reads `NORSK_WORKER_WS_URL` and `NORSK_WORKER_TOKEN`; when either is absent (the worker runs
/// without a listener) returns the disabled client; otherwise connects and says hello.
pub async fn connect_migration() -> Result<MigrationClient, ClientError> {
    match (
        std::env::var(JOB_SOCKET_ENV_URL),
        std::env::var(JOB_SOCKET_ENV_TOKEN),
    ) {
        (Ok(url), Ok(token)) => connect_migration_to(&url, &token).await,
        _ => Ok(MigrationClient::disabled()),
    }
}

/// Connects to `url` (e.g. [`crate::path::job_socket_url`]), sends `hello{token}` and waits
/// for `hello-ack` (within the contract's 5 s hello timeout).
pub async fn connect_migration_to(url: &str, token: &str) -> Result<MigrationClient, ClientError> {
    let config = WebSocketConfig::default()
        .max_frame_size(Some(JOB_SOCKET_MAX_FRAME_BYTES))
        .max_message_size(Some(JOB_SOCKET_MAX_FRAME_BYTES));
    let connect = tokio_tungstenite::connect_async_with_config(url, Some(config), true);
    let (ws, _) = tokio::time::timeout(JOB_SOCKET_HELLO_TIMEOUT, connect)
        .await
        .map_err(|_| ClientError::HelloTimeout)?
        .map_err(|e| ClientError::Connect {
            url: url.to_owned(),
            source: Box::new(e),
        })?;
    let mut client = MigrationClient {
        ws: Some(ws),
        target_of: None,
        closed: false,
    };
    client
        .send(JobToWorker::Hello {
            token: token.into(),
        })
        .await?;
    let first = tokio::time::timeout(JOB_SOCKET_HELLO_TIMEOUT, client.recv())
        .await
        .map_err(|_| ClientError::HelloTimeout)?;
    match first? {
        Some(WorkerToJob::HelloAck { migration }) => {
            client.target_of = migration.map(|m| m.id.to_string_lossy().into_owned());
            Ok(client)
        }
        Some(other) => {
            let reason = format!("expected hello-ack, got `{}`", other.kind());
            client.close_with(4400, &reason).await;
            Err(ClientError::Protocol(reason))
        }
        None => Err(ClientError::Closed {
            code: None,
            reason: "closed before hello-ack".to_owned(),
        }),
    }
}

impl MigrationClient {
    /// The no-op client.
    pub fn disabled() -> Self {
        Self {
            ws: None,
            target_of: None,
            closed: true,
        }
    }

    /// Whether this client talks to a worker.
    pub fn is_enabled(&self) -> bool {
        self.ws.is_some()
    }

    /// The migration this instance was launched as the target of (from `hello-ack`).
    pub fn target_of(&self) -> Option<&str> {
        self.target_of.as_deref()
    }

    /// The next frame from the worker (never `hello-ack`). `Ok(None)`: the disabled client, or
    /// the worker closed normally. A close with an application code is `Err(Closed)`.
    pub async fn next_event(&mut self) -> Result<Option<WorkerToJob>, ClientError> {
        match self.recv().await? {
            Some(WorkerToJob::HelloAck { .. }) => {
                self.close_with(4400, "unexpected hello-ack").await;
                Err(ClientError::Protocol("unexpected hello-ack".to_owned()))
            }
            other => Ok(other),
        }
    }

    async fn recv(&mut self) -> Result<Option<WorkerToJob>, ClientError> {
        loop {
            let Some(ws) = self.ws.as_mut().filter(|_| !self.closed) else {
                return Ok(None);
            };
            match ws.next().await {
                None => {
                    self.closed = true;
                    return Ok(None);
                }
                Some(Err(e)) => {
                    self.closed = true;
                    return Err(ClientError::Transport(Box::new(e)));
                }
                Some(Ok(Message::Close(frame))) => {
                    self.closed = true;
                    let code = frame.as_ref().map(|f| u16::from(f.code));
                    let reason = frame.map(|f| f.reason.to_string()).unwrap_or_default();
                    return match code {
                        None | Some(1000) => Ok(None),
                        Some(_) => Err(ClientError::Closed { code, reason }),
                    };
                }
                Some(Ok(Message::Text(t))) => {
                    return match parse_worker_to_job(t.as_str()).into_result() {
                        Ok(f) => Ok(Some(f)),
                        Err(reason) => {
                            self.close_with(4400, &reason).await;
                            Err(ClientError::Protocol(reason))
                        }
                    };
                }
                Some(Ok(Message::Binary(_))) => {
                    self.close_with(4400, "frames must be JSON text").await;
                    return Err(ClientError::Protocol("binary frame".to_owned()));
                }
                Some(Ok(_)) => {}
            }
        }
    }

    /// Sends any job frame (the typed helpers below are the usual way).
    pub async fn send(&mut self, frame: JobToWorker) -> Result<(), ClientError> {
        let Some(ws) = self.ws.as_mut() else {
            return Ok(());
        };
        let text = frame.to_text();
        if text.len() > JOB_SOCKET_MAX_FRAME_BYTES {
            return Err(ClientError::FrameTooLarge(text.len()));
        }
        ws.send(Message::text(text))
            .await
            .map_err(|e| ClientError::Transport(Box::new(e)))
    }

    /// Accept a `get-state`: hand over `payload` (`Json::Null` is a fine acceptance).
    pub async fn send_state(&mut self, payload: Json) -> Result<(), ClientError> {
        self.send(JobToWorker::State { payload }).await
    }

    /// Decline a `get-state`; the migration ends with no target placed.
    pub async fn refuse_state(&mut self, reason: &str) -> Result<(), ClientError> {
        self.send(JobToWorker::StateRefused {
            reason: reason.into(),
        })
        .await
    }

    /// Target: initial state applied, ready for cutover.
    pub async fn target_ready(&mut self, payload: Json) -> Result<(), ClientError> {
        self.send(JobToWorker::TargetReady { payload }).await
    }

    /// Source: output stopped (answer to `cutover-ready`).
    pub async fn source_stopped_output(&mut self, payload: Json) -> Result<(), ClientError> {
        self.send(JobToWorker::SourceStoppedOutput { payload })
            .await
    }

    /// Target: handover applied (answer to `cutover-apply`).
    pub async fn target_applied(&mut self, summary: TargetApplied) -> Result<(), ClientError> {
        self.send(JobToWorker::TargetApplied(summary)).await
    }

    /// Give up on the migration in progress.
    pub async fn abort(&mut self, reason: &str) -> Result<(), ClientError> {
        self.send(JobToWorker::Abort {
            reason: reason.into(),
        })
        .await
    }

    async fn close_with(&mut self, code: u16, reason: &str) {
        self.closed = true;
        if let Some(ws) = self.ws.as_mut() {
            let mut end = reason.len().min(123);
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            let frame = CloseFrame {
                code: WsCode::from(code),
                reason: reason.get(..end).unwrap_or_default().to_owned().into(),
            };
            let _ = ws.close(Some(frame)).await;
        }
    }

    /// Closes the socket normally.
    pub async fn close(mut self) {
        self.close_with(1000, "").await;
    }
}
