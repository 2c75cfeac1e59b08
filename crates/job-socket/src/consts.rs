//! The contract's constants, identical to `migration-socket.js`.

use std::time::Duration;

/// `JOB_SOCKET_DEFAULT_PORT`.
pub const JOB_SOCKET_DEFAULT_PORT: u16 = 6797;
/// `JOB_SOCKET_MAX_FRAME_BYTES`: 64 KiB.
pub const JOB_SOCKET_MAX_FRAME_BYTES: usize = 64 * 1024;
/// `JOB_SOCKET_HELLO_TIMEOUT_MS`.
pub const JOB_SOCKET_HELLO_TIMEOUT_MS: u64 = 5_000;
/// [`JOB_SOCKET_HELLO_TIMEOUT_MS`] as a duration.
pub const JOB_SOCKET_HELLO_TIMEOUT: Duration = Duration::from_millis(JOB_SOCKET_HELLO_TIMEOUT_MS);
/// `JOB_SOCKET_CONTAINER_HOST`: how a container reaches its own worker's host.
pub const JOB_SOCKET_CONTAINER_HOST: &str = "host.docker.internal";
/// `JOB_SOCKET_CAPABILITY`: advertised in the node inventory while the listener is up.
pub const JOB_SOCKET_CAPABILITY: &str = "norsk.io/job-socket";
/// `JOB_SOCKET_ENV.url`.
pub const JOB_SOCKET_ENV_URL: &str = "NORSK_WORKER_WS_URL";
/// `JOB_SOCKET_ENV.token`.
pub const JOB_SOCKET_ENV_TOKEN: &str = "NORSK_WORKER_TOKEN";
/// The fixed first path component.
pub const INSTANCES_PREFIX: &str = "/instances/";

/// `JobSocketCloseCode`: the worker's close codes, all in the 4000–4999 application range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseCode {
    /// 4400: a frame that breaks the protocol — unparseable, wrong side, wrong phase.
    ProtocolError,
    /// 4401: no hello in time, a wrong token, or a path naming no instance.
    Unauthorized,
    /// 4409: a newer connection for the same instance replaced this one.
    Replaced,
    /// 4413: a frame over the size cap.
    FrameTooLarge,
}

impl CloseCode {
    /// The numeric code.
    pub const fn code(self) -> u16 {
        match self {
            CloseCode::ProtocolError => 4400,
            CloseCode::Unauthorized => 4401,
            CloseCode::Replaced => 4409,
            CloseCode::FrameTooLarge => 4413,
        }
    }

    /// The code for a number, if it is one of ours.
    pub const fn from_code(code: u16) -> Option<Self> {
        match code {
            4400 => Some(CloseCode::ProtocolError),
            4401 => Some(CloseCode::Unauthorized),
            4409 => Some(CloseCode::Replaced),
            4413 => Some(CloseCode::FrameTooLarge),
            _ => None,
        }
    }
}
