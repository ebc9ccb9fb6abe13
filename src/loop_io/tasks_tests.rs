//! Tests of `tasks.rs`: where tasks run and how they wake the loop, a closed loop's tasks,
//! aborts, and what a loop keeps.

use std::sync::atomic::AtomicUsize;

use super::*;

fn counted_tasks() -> (LoopTasks, Arc<AtomicUsize>) {
    let wakes = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&wakes);
    let tasks = LoopTasks::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    (tasks, wakes)
}

#[test]
fn tasks_run_on_the_loop_thread_and_wake_it_once_from_another() {
    let (tasks, wakes) = counted_tasks();
    let (first, first_answer) = tokio::sync::oneshot::channel::<u32>();
    let (second, second_answer) = tokio::sync::oneshot::channel::<u32>();
    let got = Arc::new(Mutex::new(Vec::new()));
    for answer in [first_answer, second_answer] {
        let got = Arc::clone(&got);
        tasks.spawn(async move {
            let value = answer.await.unwrap();
            lock(&got).push((value, std::thread::current().id()));
        });
    }
    tasks.run_ready();
    assert!(
        lock(&got).is_empty() && !tasks.has_ready(),
        "both wait for their answer"
    );
    std::thread::spawn(move || {
        first.send(1).unwrap();
        second.send(2).unwrap();
    })
    .join()
    .unwrap();
    assert_eq!(
        wakes.load(Ordering::SeqCst),
        1,
        "two wake-ups from another thread, one wake"
    );
    tasks.run_ready();
    let me = std::thread::current().id();
    assert_eq!(*lock(&got), [(1, me), (2, me)]);
    assert!(
        lock(&tasks.shared.live).is_empty(),
        "finished tasks are forgotten"
    );
}

#[test]
fn a_task_run_before_its_wake_up_arrives_leaves_later_wake_ups_working() {
    let (tasks, wakes) = counted_tasks();
    let (first, first_answer) = tokio::sync::oneshot::channel::<u32>();
    let (second, second_answer) = tokio::sync::oneshot::channel::<u32>();
    tasks.spawn(async move {
        first_answer.await.unwrap();
        second_answer.await.unwrap();
    });
    // Another task wakes the first from another thread during the run, which then runs it.
    tasks.spawn(async move {
        std::thread::spawn(move || first.send(1).unwrap()).join().unwrap();
    });
    tasks.run_ready();
    assert_eq!(wakes.load(Ordering::SeqCst), 1);
    tasks.run_ready(); // the loop's wake-up: its run finds nothing queued
    std::thread::spawn(move || second.send(2).unwrap())
        .join()
        .unwrap();
    assert_eq!(
        wakes.load(Ordering::SeqCst),
        2,
        "the next wake-up from another thread wakes the loop"
    );
    tasks.run_ready();
    assert!(lock(&tasks.shared.live).is_empty());
}

#[test]
fn a_wake_up_on_the_loop_thread_queues_without_waking_the_loop() {
    let (tasks, wakes) = counted_tasks();
    let (sender, answer) = tokio::sync::oneshot::channel::<u32>();
    tasks.spawn(async move {
        answer.await.unwrap();
    });
    tasks.run_ready();
    sender.send(1).unwrap();
    assert!(tasks.has_ready());
    assert_eq!(wakes.load(Ordering::SeqCst), 0);
    tasks.run_ready();
    assert!(lock(&tasks.shared.live).is_empty());
}

/// Sets its flag when dropped.
struct Dropped(Arc<AtomicBool>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn an_aborted_task_is_dropped_and_never_runs_again() {
    let (tasks, _) = counted_tasks();
    let dropped = Arc::new(AtomicBool::new(false));
    let polls = Arc::new(AtomicUsize::new(0));
    let (sender, answer) = tokio::sync::oneshot::channel::<()>();
    let abort = tasks.spawn_abortable({
        let (guard, polls) = (Dropped(Arc::clone(&dropped)), Arc::clone(&polls));
        async move {
            let _guard = guard;
            polls.fetch_add(1, Ordering::SeqCst);
            let _ = answer.await;
            polls.fetch_add(1, Ordering::SeqCst);
        }
    });
    tasks.run_ready();
    assert_eq!(polls.load(Ordering::SeqCst), 1, "it ran until it waited");
    abort();
    assert!(dropped.load(Ordering::SeqCst), "its future is dropped at once");
    let _ = sender.send(()); // what it waited for comes: nothing runs
    tasks.run_ready();
    assert_eq!(polls.load(Ordering::SeqCst), 1);
    abort(); // a second abort finds nothing
}

#[test]
fn the_tasks_of_a_closed_loop_finish_on_the_runtime() {
    let (tasks, _) = counted_tasks();
    let (sender, answer) = tokio::sync::oneshot::channel::<u32>();
    let (finished, finished_on) = std::sync::mpsc::channel();
    let mine = std::thread::current().id();
    tasks.spawn({
        let finished = finished.clone();
        async move {
            let value = answer.await.unwrap();
            finished.send((value, std::thread::current().id())).unwrap();
        }
    });
    tasks.run_ready();
    tasks.close();
    sender.send(5).unwrap();
    let (value, thread) = finished_on
        .recv_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    assert_eq!(value, 5);
    assert_ne!(
        thread, mine,
        "it finished on the runtime, not on the closed loop's thread"
    );
    tasks.spawn(async move { finished.send((6, std::thread::current().id())).unwrap() });
    tasks.run_ready();
    let (value, thread) = finished_on
        .recv_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    assert_eq!(value, 6);
    assert_ne!(thread, mine, "a task spawned later runs there too");
}

#[test]
fn a_loop_keeps_one_of_each_local_per_owner() {
    let (tasks, _) = counted_tasks();
    let first = tasks.local(7, || Arc::new(AtomicUsize::new(1)));
    let again = tasks.local(7, || Arc::new(AtomicUsize::new(2)));
    assert!(Arc::ptr_eq(&first, &again));
    let other = tasks.local(8, || Arc::new(AtomicUsize::new(3)));
    assert_eq!(other.load(Ordering::SeqCst), 3);
    let another_type = tasks.local(7, || Arc::new(AtomicBool::new(true)));
    assert!(another_type.load(Ordering::SeqCst), "one of each type per owner");
}
