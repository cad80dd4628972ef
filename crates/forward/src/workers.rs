//! The threads that serve connections: one current-thread tokio runtime
//! per worker, each with its own SO_REUSEPORT listener per forward (made by
//! the forward, see `forward::start`). The kernel spreads new connections
//! over the listeners; a connection then lives on the thread that accepted
//! it, from accept to close: no hand-over between threads and no work
//! stealing (what Pingora measured as its better design, and the ~10 µs per
//! connection docs/benchmarks.md found in hand-offs between the workers of
//! one shared runtime).
//!
//! A worker whose thread ends other than by [`Workers::stop`] (a panic
//! unwinding out of the runtime) is reported on the channel [`Workers::start`]
//! returns, and the daemon replaces it ([`Workers::replace`]) and starts its
//! forwards' listeners again. The control socket, the status server and
//! the reconcile loop stay on the daemon's own runtime.

use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// What a running worker is to the rest of the daemon.
struct Worker {
    handle: Handle,
    /// Sent (or dropped) to end the worker's thread.
    stop: Option<oneshot::Sender<Stop>>,
    /// Bumped by each replacement.
    generation: u64,
}

enum Stop {
    Quietly,
    /// Tests: end the thread the way a bug would, by a panic.
    #[cfg(any(test, debug_assertions))]
    Panic,
}

pub struct Workers {
    slots: Vec<Mutex<Worker>>,
    died: mpsc::UnboundedSender<usize>,
}

/// Reports its worker dead when dropped armed (the thread unwinds).
struct DeathNotice {
    slot: usize,
    died: mpsc::UnboundedSender<usize>,
    armed: bool,
}

impl Drop for DeathNotice {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.died.send(self.slot);
        }
    }
}

fn spawn_worker(slot: usize, died: mpsc::UnboundedSender<usize>) -> io::Result<Worker> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let handle = rt.handle().clone();
    let (stop_tx, stop_rx) = oneshot::channel::<Stop>();
    std::thread::Builder::new()
        .name(format!("worker-{slot}"))
        .spawn(move || {
            let mut notice = DeathNotice {
                slot,
                died,
                armed: true,
            };
            let how = rt.block_on(async move { stop_rx.await.unwrap_or(Stop::Quietly) });
            match how {
                Stop::Quietly => notice.armed = false,
                #[cfg(any(test, debug_assertions))]
                Stop::Panic => panic!("worker {slot} stopped by a test"),
            }
            // The runtime and every task still on it (listeners,
            // connections) are dropped here.
            drop(rt);
        })?;
    Ok(Worker {
        handle,
        stop: Some(stop_tx),
        generation: 0,
    })
}

impl Workers {
    /// Start `n` workers. The receiver gets the slot of each worker whose
    /// thread died.
    pub fn start(n: usize) -> io::Result<(Arc<Workers>, mpsc::UnboundedReceiver<usize>)> {
        let (died, rx) = mpsc::unbounded_channel();
        let slots = (0..n.max(1))
            .map(|i| spawn_worker(i, died.clone()).map(Mutex::new))
            .collect::<io::Result<Vec<_>>>()?;
        Ok((Arc::new(Workers { slots, died }), rx))
    }

    /// How many worker threads there are (at least one).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Never: there is always one worker at least.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The worker that serves the UDP forward on `port`: one, so that its
    /// session table stays whole; the forwards spread by port.
    pub fn for_udp(&self, port: u16) -> usize {
        usize::from(port) % self.len().max(1)
    }

    fn slot(&self, i: usize) -> std::sync::MutexGuard<'_, Worker> {
        self.slots[i % self.slots.len()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Run `fut` on worker `i`: it and every task it spawns stay on that
    /// thread.
    pub fn spawn<F>(&self, i: usize, fut: F) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.slot(i).handle.spawn(fut)
    }

    /// Start a new worker in slot `i` (after its thread died); its tasks
    /// are gone with the old one.
    pub fn replace(&self, i: usize) -> io::Result<u64> {
        let mut w = spawn_worker(i, self.died.clone())?;
        let mut slot = self.slot(i);
        w.generation = slot.generation + 1;
        *slot = w;
        Ok(slot.generation)
    }

    /// How many times slot `i` was replaced.
    #[cfg(test)]
    pub fn generation(&self, i: usize) -> u64 {
        self.slot(i).generation
    }

    /// End every worker (their tasks are dropped with them).
    pub fn stop(&self) {
        for i in 0..self.slots.len() {
            if let Some(s) = self.slot(i).stop.take() {
                let _ = s.send(Stop::Quietly);
            }
        }
    }

    /// Tests (and debug builds, on SIGUSR2): make worker `i`'s thread die
    /// by a panic, as a bug would.
    #[cfg(any(test, debug_assertions))]
    pub fn kill(&self, i: usize) {
        if let Some(s) = self.slot(i).stop.take() {
            let _ = s.send(Stop::Panic);
        }
    }
}

/// How many workers by default: the CPUs this process may run on (its
/// affinity and cgroup quota), else 1.
pub fn default_count() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn thread_of(w: &Workers, i: usize) -> String {
        w.spawn(i, async {}).await.unwrap();
        let (tx, rx) = oneshot::channel();
        w.spawn(i, async move {
            let _ = tx.send(std::thread::current().name().unwrap_or("").to_string());
        });
        rx.await.unwrap()
    }

    #[tokio::test]
    async fn each_worker_runs_its_tasks_and_their_children_on_its_own_thread() {
        let (w, _died) = Workers::start(2).unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!(thread_of(&w, 0).await, "worker-0");
        assert_eq!(thread_of(&w, 1).await, "worker-1");
        // A task spawned by a task stays on the same worker.
        let (tx, rx) = oneshot::channel();
        w.spawn(1, async move {
            tokio::spawn(async move {
                let _ = tx.send(std::thread::current().name().unwrap_or("").to_string());
            });
        });
        assert_eq!(rx.await.unwrap(), "worker-1");
        w.stop();
    }

    #[tokio::test]
    async fn a_worker_that_dies_is_reported_and_replaced() {
        let (w, mut died) = Workers::start(2).unwrap();
        // A task on it, like a listener: it ends with the worker.
        let listener = w.spawn(0, std::future::pending());
        w.kill(0);
        let slot = tokio::time::timeout(Duration::from_secs(5), died.recv())
            .await
            .expect("the death was reported")
            .unwrap();
        assert_eq!(slot, 0);
        assert!(listener.await.unwrap_err().is_cancelled());
        assert_eq!(w.replace(0).unwrap(), 1);
        assert_eq!(w.generation(0), 1);
        assert_eq!(thread_of(&w, 0).await, "worker-0");
        // The other worker never noticed.
        assert_eq!(w.generation(1), 0);
        assert_eq!(thread_of(&w, 1).await, "worker-1");
        // A quiet stop is not a death.
        w.stop();
        assert!(
            tokio::time::timeout(Duration::from_millis(300), died.recv())
                .await
                .is_err()
        );
    }
}
