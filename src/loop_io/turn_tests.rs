//! A turn of a loop's I/O as the binding runs it (`py/bridge/turn.rs`): the ready tasks run,
//! then each connection writes what they queued; the replies wake the tasks, which finish.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use redis::Value;

use super::connection::LoopConnection;
use super::connections::Endpoint;
use super::socket::Address;
use super::tasks::{here, LoopTasks};
use crate::sync::lock;

/// The data segments `stream` received so far (Linux's `TCP_INFO`): a write of a few hundred
/// bytes arrives as one, and separate writes as one each.
fn segments_in(stream: &TcpStream) -> u32 {
    // SAFETY: `tcp_info` is plain integers, for which all zeroes is a value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut length = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `length` bytes into `info`, which has that many.
    let status = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut length,
        )
    };
    assert_eq!(status, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    info.tcpi_data_segs_in
}

/// A server that reads the calls of each turn (`calls`: how many), notes how many segments
/// they came in, and answers call `i` of a turn with the integer `i`; it returns the segments
/// of each turn.
fn serve(listener: TcpListener, turns: &'static [usize]) -> std::thread::JoinHandle<Vec<u32>> {
    std::thread::spawn(move || {
        let (mut peer, _) = listener.accept().unwrap();
        // Counted from the connection's start: its first data may come before the accept.
        let (mut segments, mut counted) = (Vec::new(), 0);
        for &calls in turns {
            let mut got = Vec::new();
            let mut buffer = [0u8; 4096];
            while got.windows(4).filter(|w| w == b"PING").count() < calls {
                let n = peer.read(&mut buffer).unwrap();
                assert!(n > 0, "the connection closed");
                got.extend_from_slice(&buffer[..n]);
            }
            let now = segments_in(&peer);
            segments.push(now - counted);
            counted = now;
            let replies: String = (0..calls).map(|i| format!(":{i}\r\n")).collect();
            peer.write_all(replies.as_bytes()).unwrap();
        }
        segments
    })
}

async fn connect(address: Address) -> Arc<LoopConnection> {
    let endpoint = Endpoint {
        owner: 1,
        address,
        handshake: Vec::new(),
    };
    here()
        .expect("run by its loop")
        .connection(&endpoint, Duration::from_secs(10))
        .await
        .unwrap()
}

#[test]
fn ready_tasks_run_then_what_they_queued_goes_in_one_write_per_turn_whatever_the_number_of_calls() {
    const TURNS: &[usize] = &[1, 2, 50];
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = Address::Tcp(listener.local_addr().unwrap().to_string());
    let server = serve(listener, TURNS);
    let tasks = LoopTasks::new(|| {});
    // The connection opens first, on the core's runtime.
    tasks.spawn(connect(address.clone()).map(drop));
    let deadline = Instant::now() + Duration::from_secs(10);
    while tasks.connections().all().is_empty() {
        assert!(Instant::now() < deadline, "the connection did not open");
        tasks.run_ready();
        std::thread::sleep(Duration::from_millis(1));
    }
    for &calls in TURNS {
        let answers = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..calls {
            let (address, answers) = (address.clone(), Arc::clone(&answers));
            tasks.spawn(async move {
                let connection = connect(address).await;
                let reply = connection.call(&redis::cmd("PING")).await.unwrap().unwrap();
                lock(&answers).push(reply);
            });
        }
        // The turn: the ready tasks run (each queues its call), then each connection writes.
        tasks.run_ready();
        for connection in tasks.connections().all() {
            assert!(!connection.flush(), "a turn's calls are written whole");
        }
        // The replies resolve the calls, whose tasks then run and finish.
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&answers).len() < calls {
            assert!(Instant::now() < deadline, "the replies did not come");
            for connection in tasks.connections().all() {
                connection.readable();
            }
            tasks.run_ready();
            std::thread::sleep(Duration::from_millis(1));
        }
        let expected: Vec<Value> = (0..calls as i64).map(Value::Int).collect();
        assert_eq!(*lock(&answers), expected, "each call has its own reply, in order");
    }
    assert_eq!(
        server.join().unwrap(),
        [1, 1, 1],
        "one write per turn, whatever the number of calls ({TURNS:?})"
    );
}
