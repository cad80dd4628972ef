//! The cluster Services Devices' reverse entries name: fetched for a
//! reconcile (`lookup`), and the Devices a changed Service concerns
//! (`devices_naming`), so that a Service that appears, goes, or gets a new
//! ClusterIP re-renders their NADs. Reads only (the cache of every
//! Service, `run::caches`): the operator never writes
//! a Service it does not own.

use crate::run::caches;
use crate::run::context::{Ctx, Error};
use edgelink_operator::crd::Device;
use edgelink_operator::reverse::{service_keys, Services};
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use std::sync::Arc;

/// The Services `d`'s reverse entries name, those that exist (from the
/// cache of every Service, once it has listed).
pub async fn lookup(ctx: &Ctx, d: &Device) -> Result<Services, Error> {
    let mut found = Services::new();
    for (ns, name) in service_keys(d) {
        let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
        if let Some(s) = caches::get(&ctx.caches.services, &api, "Service", &ns, &name).await? {
            found.insert((ns, name), (*s).clone());
        }
    }
    Ok(found)
}

/// The Devices among `devices` whose reverse entries name `svc`.
pub fn devices_naming(svc: &Service, devices: Vec<Arc<Device>>) -> Vec<ObjectRef<Device>> {
    let key = (svc.namespace().unwrap_or_default(), svc.name_any());
    devices
        .into_iter()
        .filter(|d| service_keys(d).contains(&key))
        .map(|d| ObjectRef::from_obj(&*d))
        .collect()
}
