//! The cluster's resolver for a pod whose own resolv.conf cannot be read
//! (the daemon runs without `hostPID`, and Multus passes no `dns` to its
//! delegates): the daemon's own resolv.conf, which the kubelet writes for
//! a `ClusterFirstWithHostNet` pod as for a `ClusterFirst` one, rewritten
//! for the pod's namespace. That is the file the kubelet writes into a
//! `ClusterFirst` pod of that namespace (the default policy, which the
//! proxy pods have): the cluster DNS Service's address, the search list
//! `<namespace>.svc.<domain> svc.<domain> <domain>` followed by the node's
//! own search domains, the same options.

use crate::ResolvConf;

/// `own` rewritten for a `ClusterFirst` pod of `namespace`; None when
/// `own` is not a kubelet's cluster file (its search list does not start
/// `<ns>.svc.<domain> svc.<domain> <domain>`: the daemon's resolver is
/// the node's, which knows nothing of Services) or `namespace` is no
/// Kubernetes namespace name (a DNS-1123 label).
pub fn cluster_first_for(own: &ResolvConf, namespace: &str) -> Option<ResolvConf> {
    if !is_dns1123_label(namespace) {
        return None;
    }
    let [first, second, third, rest @ ..] = own.search.as_slice() else {
        return None;
    };
    let domain = second.strip_prefix("svc.")?;
    let (own_ns, own_domain) = first.split_once(".svc.")?;
    if own_domain != domain || third != domain || !is_dns1123_label(own_ns) {
        return None;
    }
    let mut search = vec![
        format!("{namespace}.svc.{domain}"),
        second.clone(),
        third.clone(),
    ];
    search.extend(rest.iter().cloned());
    Some(ResolvConf {
        search,
        ..own.clone()
    })
}

/// A namespace's name: at most 63 of a-z, 0-9 and '-', neither first nor
/// last a '-'.
fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(text: &str) -> ResolvConf {
        ResolvConf::parse(text).expect("parses")
    }

    #[test]
    fn the_daemons_cluster_file_becomes_the_pods() {
        // as the kubelet writes it for edgelinkd (ClusterFirstWithHostNet)
        // on a node whose own resolv.conf searches plant.example
        let own = conf(
            "search edgelink-system.svc.cluster.local svc.cluster.local cluster.local plant.example\n\
             nameserver 10.0.0.10\noptions ndots:5\n",
        );
        let pod = cluster_first_for(&own, "hil").expect("a cluster file");
        assert_eq!(
            pod.search,
            [
                "hil.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "plant.example"
            ]
        );
        assert_eq!(pod.nameservers, own.nameservers);
        assert_eq!(pod.ndots, 5);
        assert_eq!(
            pod.candidates("collector")[0],
            "collector.hil.svc.cluster.local."
        );
    }

    #[test]
    fn a_cluster_domain_of_its_own_is_kept() {
        let own = conf(
            "search kube-system.svc.k8s.plant svc.k8s.plant k8s.plant\nnameserver 10.96.0.10\n",
        );
        let pod = cluster_first_for(&own, "line-3").expect("a cluster file");
        assert_eq!(
            pod.search,
            ["line-3.svc.k8s.plant", "svc.k8s.plant", "k8s.plant"]
        );
    }

    #[test]
    fn the_nodes_own_resolver_is_not_the_clusters() {
        // dnsPolicy Default, or a daemon outside Kubernetes: the node's file
        for text in [
            "search plant.example\nnameserver 192.0.2.53\n",
            "nameserver 192.0.2.53\n",
            // looks close, but the domains disagree
            "search a.svc.cluster.local svc.other.local cluster.local\nnameserver 10.0.0.10\n",
            "search a.svc.cluster.local svc.cluster.local other.local\nnameserver 10.0.0.10\n",
        ] {
            assert!(cluster_first_for(&conf(text), "hil").is_none(), "{text}");
        }
    }

    #[test]
    fn a_namespace_that_is_no_label_gets_nothing() {
        let own = conf(
            "search e.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.0.0.10\n",
        );
        for ns in [
            "",
            "Hil",
            "hil.evil",
            "-hil",
            "hil-",
            &"a".repeat(64),
            "hil svc",
        ] {
            assert!(cluster_first_for(&own, ns).is_none(), "{ns:?}");
        }
        assert!(cluster_first_for(&own, &"a".repeat(63)).is_some());
    }
}
