//! The one tokio runtime of the process. Its threads never attach to the Python interpreter,
//! so nothing they do can race the interpreter's shutdown.

use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle, Runtime};

pub fn handle() -> &'static Handle {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("stream-lease")
                .enable_all()
                .build()
                .expect("fastapi_stream_lease could not start its tokio runtime")
        })
        .handle()
}
