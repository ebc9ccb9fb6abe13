//! The socket of a loop's connection, TCP or a Unix socket, and how one is opened: on the core's
//! runtime (for TCP the name's lookup, then each of its addresses in turn), then handed to the
//! loop as a plain socket that the loop's selector watches.

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// Where a loop's connection goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// `host:port`, a name or an address.
    Tcp(String),
    /// The path of a Unix socket.
    Unix(PathBuf),
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp(host_port) => f.write_str(host_port),
            Address::Unix(path) => write!(f, "unix://{}", path.display()),
        }
    }
}

pub(super) enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
    /// A socket connected to `address`, opened by the core's runtime.
    pub(super) async fn connect(address: &Address) -> std::io::Result<Socket> {
        match address {
            Address::Tcp(host_port) => {
                let stream = connect_any(host_port).await?.into_std()?;
                stream.set_nodelay(true)?;
                Ok(Socket::Tcp(stream))
            }
            Address::Unix(path) => Ok(Socket::Unix(
                tokio::net::UnixStream::connect(path).await?.into_std()?,
            )),
        }
    }

    pub(super) fn set_nonblocking(&self, nonblocking: bool) -> std::io::Result<()> {
        match self {
            Socket::Tcp(stream) => stream.set_nonblocking(nonblocking),
            Socket::Unix(stream) => stream.set_nonblocking(nonblocking),
        }
    }

    /// Bounds each blocking read and write by `limit`.
    pub(super) fn set_timeouts(&self, limit: Duration) -> std::io::Result<()> {
        match self {
            Socket::Tcp(stream) => stream
                .set_read_timeout(Some(limit))
                .and_then(|()| stream.set_write_timeout(Some(limit))),
            Socket::Unix(stream) => stream
                .set_read_timeout(Some(limit))
                .and_then(|()| stream.set_write_timeout(Some(limit))),
        }
    }
}

impl Read for &Socket {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        match *self {
            Socket::Tcp(stream) => Read::read(&mut &*stream, buffer),
            Socket::Unix(stream) => Read::read(&mut &*stream, buffer),
        }
    }
}

impl Write for &Socket {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match *self {
            Socket::Tcp(stream) => Write::write(&mut &*stream, bytes),
            Socket::Unix(stream) => Write::write(&mut &*stream, bytes),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Socket::Tcp(stream) => stream.as_raw_fd(),
            Socket::Unix(stream) => stream.as_raw_fd(),
        }
    }
}

/// A connection to the first of `host_port`'s addresses that accepts one.
async fn connect_any(host_port: &str) -> std::io::Result<tokio::net::TcpStream> {
    let mut last = std::io::Error::new(ErrorKind::NotFound, format!("{host_port} resolves to no address"));
    for at in tokio::net::lookup_host(host_port).await? {
        match tokio::net::TcpStream::connect(at).await {
            Ok(stream) => return Ok(stream),
            Err(error) => last = error,
        }
    }
    Err(last)
}
