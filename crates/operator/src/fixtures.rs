//! Test fixtures: the examples of cni-conf/, as the user applies them.

use crate::crd::{Device, EdgeNetwork};

pub fn device() -> Device {
    let mut d: Device = serde_norway::from_str(include_str!("../../../cni-conf/device01-01.yaml"))
        .expect("device01-01.yaml");
    d.metadata.uid = Some("5f1c-uid".into());
    d
}

pub fn network() -> EdgeNetwork {
    serde_norway::from_str(include_str!(
        "../../../cni-conf/edgenetwork-plant-floor.yaml"
    ))
    .expect("edgenetwork-plant-floor.yaml")
}
