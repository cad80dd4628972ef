//! Leader election (a coordination.k8s.io Lease, kube-lease-manager): of
//! any number of replicas one reconciles; the others wait, ready to take
//! over when its lease runs out. The leader also points the webhook
//! Service (a Service without selector) at itself, by writing its
//! Endpoints, so that edgelinkd's reports reach the replica that uses them.

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference,
};
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseParams};
use std::net::IpAddr;
use tokio::sync::watch;

pub const LEASE_SECONDS: u64 = 15;
pub const LEASE_GRACE_SECONDS: u64 = 5;

pub struct Election {
    pub namespace: String,
    pub lease: String,
    pub identity: String,
}

/// Wait until this replica holds the lease. The receiver turns `false`
/// when it is lost; dropping it releases the lease (at shutdown).
pub async fn acquire(
    client: Client,
    e: &Election,
) -> anyhow::Result<(
    watch::Receiver<bool>,
    tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
)> {
    let manager = LeaseManagerBuilder::new(client, &e.lease)
        .with_namespace(&e.namespace)
        .with_parameters(
            LeaseParams::new(e.identity.clone(), LEASE_SECONDS, LEASE_GRACE_SECONDS)
                .with_field_manager(crate::MANAGER_LEASE),
        )
        .build()
        .await
        .map_err(|err| anyhow::anyhow!("Lease {}/{}: {err}", e.namespace, e.lease))?;
    let (mut rx, task) = manager.watch().await;
    tracing::info!(lease = %e.lease, identity = %e.identity, "waiting for the lease");
    while !*rx.borrow_and_update() {
        rx.changed()
            .await
            .map_err(|_| anyhow::anyhow!("the lease manager stopped"))?;
    }
    tracing::info!(lease = %e.lease, identity = %e.identity, "leading");
    Ok((rx, task))
}

/// Point Service `service`'s Endpoints at this pod (`ip`:`port`).
pub async fn claim_webhook(
    client: Client,
    namespace: &str,
    service: &str,
    pod: &str,
    ip: IpAddr,
    port: u16,
) -> anyhow::Result<()> {
    let api: Api<Endpoints> = Api::namespaced(client, namespace);
    let ep = Endpoints {
        metadata: kube::api::ObjectMeta {
            name: Some(service.into()),
            namespace: Some(namespace.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/name".to_string(),
                    "edgelink-operator".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        subsets: Some(vec![EndpointSubset {
            addresses: Some(vec![EndpointAddress {
                ip: ip.to_string(),
                target_ref: Some(ObjectReference {
                    kind: Some("Pod".into()),
                    name: Some(pod.into()),
                    namespace: Some(namespace.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ports: Some(vec![EndpointPort {
                name: Some("webhook".into()),
                port: port.into(),
                protocol: Some("TCP".into()),
                app_protocol: None,
            }]),
            not_ready_addresses: None,
        }]),
    };
    let mut value = serde_json::to_value(&ep)?;
    value["apiVersion"] = "v1".into();
    value["kind"] = "Endpoints".into();
    api.patch(
        service,
        &PatchParams::apply(crate::MANAGER).force(),
        &Patch::Apply(value),
    )
    .await
    .map_err(|err| anyhow::anyhow!("Endpoints {namespace}/{service}: {err}"))?;
    tracing::info!(%service, %ip, port, "the webhook Service leads to this replica");
    Ok(())
}
