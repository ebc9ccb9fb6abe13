//! A Redis connection owned by one event loop: a non-blocking socket (TCP or Unix, `socket.rs`)
//! whose readiness the loop's selector reports (the binding watches it with `add_reader`, and
//! with `add_writer` only while a write is partial). Commands are encoded by redis-rs (`Cmd`) into one buffer
//! that the loop writes once per turn, whatever number of calls its tasks made; replies are
//! parsed by redis-rs's own decoder (`ValueCodec`, which resumes a reply split across reads)
//! and go to their callers in order: Redis answers a connection's commands in the order sent.
//! A connection opens with the URL's handshake (`HELLO`, `AUTH`, `SELECT`) queued before any
//! call, in the same write: an error reply to it fails the connection and every call behind it
//! with that error, so that no call runs unauthenticated or on the wrong database.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use redis::{Cmd, RedisError, RedisResult, Value, ValueCodec};
use tokio::sync::oneshot;
use tokio_util::codec::Decoder;

use super::socket::{Address, Socket};

use crate::runtime;
use crate::sync::lock;

/// Bytes read per `read` call.
const READ_CHUNK: usize = 16 * 1024;

/// What the calls in flight on a connection whose event loop closed fail with.
pub const LOOP_CLOSED: &str = "the event loop that made this call closed before Redis answered";

/// A reply, or why none will come.
pub type Reply = RedisResult<Value>;

pub struct LoopConnection {
    /// Which store the connection serves (a loop may hold one per store).
    pub owner: u64,
    /// The server it goes to (behind Sentinel, the master when it opened).
    pub address: Address,
    stream: Socket,
    state: Mutex<State>,
    /// Closed by an error, or by its loop: calls go to a new connection.
    broken: AtomicBool,
    /// How long a call may take (`redis_timeout`): bounds the reads of a closed loop's replies.
    limit: Duration,
    /// Its loop closed: the replies still due are read on a thread of the core's runtime.
    draining: AtomicBool,
}

#[derive(Default)]
struct State {
    /// Encoded commands not yet written, from `written` on.
    out: Vec<u8>,
    written: usize,
    read: BytesMut,
    codec: ValueCodec,
    /// Who waits for each reply, in the order sent.
    pending: VecDeque<Caller>,
}

/// Who waits for a reply.
enum Caller {
    /// A call: the reply goes to it.
    Call(oneshot::Sender<Reply>),
    /// A command of the handshake: an error fails the connection.
    Handshake,
}

impl LoopConnection {
    /// A connection on `stream`, made non-blocking; `handshake` is queued before any call.
    pub(super) fn new(
        owner: u64,
        address: Address,
        stream: Socket,
        limit: Duration,
        handshake: &[Cmd],
    ) -> std::io::Result<Self> {
        stream.set_nonblocking(true)?;
        let mut state = State::default();
        for cmd in handshake {
            cmd.write_packed_command(&mut state.out);
            state.pending.push_back(Caller::Handshake);
        }
        Ok(LoopConnection {
            owner,
            address,
            stream,
            state: Mutex::new(state),
            broken: AtomicBool::new(false),
            limit,
            draining: AtomicBool::new(false),
        })
    }

    pub fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Whether a command waits for its reply, or to be written.
    pub fn is_waiting(&self) -> bool {
        let state = lock(&self.state);
        !state.pending.is_empty() || state.written < state.out.len()
    }

    /// Queues `cmd`, to be written at the end of the loop's turn; resolves to its reply.
    pub fn call(&self, cmd: &Cmd) -> oneshot::Receiver<Reply> {
        let (sender, reply) = oneshot::channel();
        if self.is_broken() {
            let _ = sender.send(Err(dropped("the connection closed")));
            return reply;
        }
        let mut state = lock(&self.state);
        cmd.write_packed_command(&mut state.out);
        state.pending.push_back(Caller::Call(sender));
        reply
    }

    /// Writes what is queued; true while some is left (the loop then watches for writability).
    pub fn flush(&self) -> bool {
        let mut state = lock(&self.state);
        while state.written < state.out.len() {
            let State { out, written, .. } = &mut *state;
            match (&self.stream).write(&out[*written..]) {
                Ok(0) => return self.fail(state, "Redis closed the connection"),
                Ok(n) => *written += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) => return self.fail_with(state, e.into()),
            }
        }
        state.out.clear();
        state.written = 0;
        false
    }

    /// Reads what arrived and hands each reply to its caller.
    pub fn readable(&self) {
        let mut state = lock(&self.state);
        loop {
            let start = state.read.len();
            state.read.resize(start + READ_CHUNK, 0);
            let outcome = (&self.stream).read(&mut state.read[start..]);
            let got = match outcome {
                Ok(n) => n,
                Err(ref e) if e.kind() == ErrorKind::Interrupted => 0,
                Err(ref e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    state.read.truncate(start);
                    return;
                }
                Err(e) => {
                    state.read.truncate(start);
                    self.fail_with(state, e.into());
                    return;
                }
            };
            state.read.truncate(start + got);
            if got == 0 && outcome.is_ok() {
                self.fail(state, "Redis closed the connection");
                return;
            }
            loop {
                let State {
                    read, codec, pending, ..
                } = &mut *state;
                match codec.decode(read) {
                    Ok(Some(value)) => match pending.pop_front() {
                        // A caller gone (its deadline passed) leaves its reply unread.
                        Some(Caller::Call(caller)) => drop(caller.send(Ok(value))),
                        Some(Caller::Handshake) => {
                            if let Value::ServerError(refused) = value {
                                self.refuse_all(state, refused);
                                return;
                            }
                        }
                        None => {
                            self.fail(state, "Redis sent a reply nobody asked for");
                            return;
                        }
                    },
                    Ok(None) => break,
                    Err(error) => {
                        self.fail_with(state, error);
                        return;
                    }
                }
            }
            // Read with blocking calls once its loop closed: no more than is due.
            if self.draining.load(Ordering::Acquire) && state.pending.is_empty() {
                return;
            }
        }
    }

    /// Its loop closed: no call comes any more, and the replies still due are read on a
    /// blocking thread of the core's runtime, each within the call limit, so that their
    /// callers (finishing on tokio) learn what Redis did. A grant must come back to be released
    /// after it: a release sent on another connection could run before it. What does not come
    /// within the limit fails as `LOOP_CLOSED` (a client-side error: it tells nothing of Redis'
    /// health).
    pub fn close_for_loop(self: &Arc<Self>) {
        self.broken.store(true, Ordering::Release);
        if lock(&self.state).pending.is_empty() {
            return;
        }
        self.draining.store(true, Ordering::Release);
        let connection = Arc::clone(self);
        runtime::handle().spawn_blocking(move || connection.read_what_is_due());
    }

    fn read_what_is_due(&self) {
        let blocking = self
            .stream
            .set_nonblocking(false)
            .and_then(|()| self.stream.set_timeouts(self.limit));
        if blocking.is_ok() && !self.flush() {
            loop {
                let due = lock(&self.state).pending.len();
                if due == 0 {
                    break;
                }
                self.readable();
                if lock(&self.state).pending.len() == due {
                    break; // nothing came within the limit
                }
            }
        }
        let closed = (redis::ErrorKind::Client, LOOP_CLOSED).into();
        self.fail_with(lock(&self.state), closed);
    }

    /// Gives the connection up (its server is no longer the one to call): the calls in flight
    /// fail with `why`, and the next calls open a new connection.
    pub(super) fn abandon(&self, why: &str) {
        self.fail(lock(&self.state), why);
    }

    fn fail(&self, state: std::sync::MutexGuard<'_, State>, why: &str) -> bool {
        self.fail_with(state, dropped(why))
    }

    /// Marks the connection broken and fails its callers with `error`; the socket itself is
    /// closed when the loop has stopped watching it (`LoopConnections::retire`). False: nothing
    /// more to write.
    fn fail_with(&self, state: std::sync::MutexGuard<'_, State>, error: RedisError) -> bool {
        self.answer_all(state, || Err(clone_error(&error)));
        false
    }

    /// The handshake was refused (a wrong password, a database that does not exist): every call
    /// behind it gets the server's error as its reply, so that it says what to fix as on the
    /// tokio path.
    fn refuse_all(&self, state: std::sync::MutexGuard<'_, State>, refused: redis::ServerError) {
        self.answer_all(state, || Ok(Value::ServerError(refused.clone())));
    }

    /// Marks the connection broken and answers every caller waiting on it with `reply()`.
    fn answer_all(&self, mut state: std::sync::MutexGuard<'_, State>, reply: impl Fn() -> Reply) {
        self.broken.store(true, Ordering::Release);
        let pending = std::mem::take(&mut state.pending);
        state.out.clear();
        state.written = 0;
        drop(state);
        for caller in pending {
            if let Caller::Call(caller) = caller {
                let _ = caller.send(reply());
            }
        }
    }
}

/// A connection error as redis-rs says it, so that it maps to what the user can act on as on
/// the tokio path (an I/O error: Redis unavailable).
fn dropped(why: &str) -> RedisError {
    std::io::Error::new(ErrorKind::ConnectionReset, why.to_owned()).into()
}

fn clone_error(error: &RedisError) -> RedisError {
    if error.kind() == redis::ErrorKind::Client {
        (redis::ErrorKind::Client, LOOP_CLOSED).into()
    } else if error.is_io_error() {
        std::io::Error::new(ErrorKind::ConnectionReset, error.to_string()).into()
    } else {
        (
            redis::ErrorKind::Io,
            "the connection to Redis failed",
            error.to_string(),
        )
            .into()
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::time::Instant;

    use super::*;

    /// Reads on `connection` until `reply` comes (or the deadline passes).
    fn read_until(connection: &LoopConnection, reply: &mut oneshot::Receiver<Reply>) -> Reply {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            connection.readable();
            match reply.try_recv() {
                Ok(reply) => return reply,
                Err(oneshot::error::TryRecvError::Empty) => {
                    assert!(Instant::now() < deadline, "no reply came");
                    std::thread::yield_now();
                }
                Err(closed) => panic!("the caller was dropped: {closed}"),
            }
        }
    }

    #[test]
    fn replies_split_across_reads_reach_their_callers_in_order_and_a_close_fails_the_rest() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut peer, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buffer = [0u8; 256];
            // Both commands, written together in one turn.
            while got.windows(4).filter(|w| w == b"PING").count() < 2 {
                let n = peer.read(&mut buffer).unwrap();
                got.extend_from_slice(&buffer[..n]);
            }
            // The first reply, then the second split in the middle of an element.
            for piece in [&b"+PONG\r\n*2\r\n:1"[..], &b"7\r\n$2\r\nhi\r\n"[..]] {
                peer.write_all(piece).unwrap();
                peer.flush().unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
            let mut third = [0u8; 64];
            let _ = peer.read(&mut third);
            // Closed with the third command unanswered.
        });
        let stream = Socket::Tcp(std::net::TcpStream::connect(&address).unwrap());
        let connection =
            LoopConnection::new(1, Address::Tcp(address), stream, Duration::from_secs(5), &[]).unwrap();
        let mut first = connection.call(&redis::cmd("PING"));
        let mut second = connection.call(&redis::cmd("PING"));
        assert!(!connection.flush(), "two small commands go in one write");
        assert_eq!(
            read_until(&connection, &mut first).unwrap(),
            Value::SimpleString("PONG".into())
        );
        assert_eq!(
            read_until(&connection, &mut second).unwrap(),
            Value::Array(vec![Value::Int(17), Value::BulkString(b"hi".to_vec())])
        );
        let mut third = connection.call(&redis::cmd("PING"));
        connection.flush();
        let failed = read_until(&connection, &mut third).unwrap_err();
        assert!(
            failed.is_io_error(),
            "a closed connection fails its calls as I/O: {failed}"
        );
        assert!(connection.is_broken());
        server.join().unwrap();
    }
}
