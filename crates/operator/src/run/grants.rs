//! The leader's book of the Devices' virtual-address grants
//! (`edgelink_operator::vip::book`), shared by the controller, which
//! places each Device's holder (`run::holds`), and the heartbeat endpoint,
//! which grants from it (`run::server`).

use edgelink_operator::crd::Device;
use edgelink_operator::vip::book::{Answer, Book};
use kube::ResourceExt;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// `namespace/device`: a Device's key in the book.
pub fn key(d: &Device) -> String {
    format!("{}/{}", d.namespace().unwrap_or_default(), d.name_any())
}

/// The leader's book of grants.
pub struct Holds {
    book: Mutex<Book>,
}

impl Holds {
    /// Grants last `hold`: the node-lost bound (a lost holder's address
    /// moves when its node is taken as lost).
    pub fn new(hold: Duration) -> Holds {
        Holds {
            book: Mutex::new(Book::new(hold)),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This replica leads from now.
    pub fn leading(&self) {
        self.lock().leading(Instant::now());
    }

    /// A heartbeat of `node`: its grants and releases.
    pub fn beat(&self, node: &str, holding: &[String]) -> Answer {
        self.lock().beat(node, holding, Instant::now())
    }

    /// A deleted Device (`namespace/device`): its grants run out.
    pub fn forget(&self, device: &str) {
        self.lock().forget(device);
    }
}
