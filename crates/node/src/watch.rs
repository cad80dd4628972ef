//! Notice new and removed attachment records at once: inotify on
//! `<stateDir>/attachments/` asks for a pass over the files it names (a
//! full pass when it lost events).

use crate::node::Node;
use futures_util::StreamExt;
use inotify::{EventMask, Inotify, WatchMask};
use std::sync::Arc;

pub fn start(d: Arc<Node>) -> std::io::Result<()> {
    let dir = edgelink_attachment::RecordStore::new(&d.settings.state_dir)
        .dir()
        .to_path_buf();
    std::fs::create_dir_all(&dir)?;
    let ino = Inotify::init()?;
    ino.watches().add(
        &dir,
        WatchMask::CLOSE_WRITE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM
            | WatchMask::DELETE
            | WatchMask::CREATE,
    )?;
    let mut stream = ino.into_event_stream(vec![0u8; 4096])?;
    tokio::spawn(async move {
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(e) => match e.name {
                    Some(name) if !e.mask.contains(EventMask::Q_OVERFLOW) => {
                        d.ask_file(name.to_string_lossy().into_owned())
                    }
                    _ => d.ask_pass(),
                },
                Err(e) => {
                    tracing::warn!(error = %e, "inotify failed; relying on the periodic rescan");
                    return;
                }
            }
        }
    });
    Ok(())
}
