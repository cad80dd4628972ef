//! CNI_ARGS: `K=V;K=V`, as runtimes and Multus send it.
//!
//! Runtimes are messy here: Multus repeats `IgnoreUnknown`, podman sends
//! `IgnoreUnknown=1`, some callers leave empty segments. The parser keeps
//! every well-formed pair; a repeated key takes its last value; unknown keys
//! are the caller's to ignore.

/// Parsed CNI_ARGS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pairs: Vec<(String, String)>,
    /// Segments without `=` (kept for diagnostics, otherwise ignored).
    pub malformed: Vec<String>,
}

impl CniArgs {
    pub fn parse(raw: &str) -> CniArgs {
        let mut args = CniArgs::default();
        for seg in raw.split(';') {
            let seg = seg.trim();
            if seg.is_empty() {
                continue;
            }
            match seg.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => args
                    .pairs
                    .push((k.trim().to_string(), v.trim().to_string())),
                _ => args.malformed.push(seg.to_string()),
            }
        }
        args
    }

    /// Every well-formed pair, in the order given (repeats included).
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// The last value given for `key` (keys are case-sensitive, as in libcni).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A non-empty value for `key`.
    pub fn get_nonempty(&self, key: &str) -> Option<&str> {
        self.get(key).filter(|v| !v.is_empty())
    }

    pub fn pod_namespace(&self) -> Option<&str> {
        self.get_nonempty("K8S_POD_NAMESPACE")
    }

    pub fn pod_name(&self) -> Option<&str> {
        self.get_nonempty("K8S_POD_NAME")
    }

    pub fn pod_uid(&self) -> Option<&str> {
        self.get_nonempty("K8S_POD_UID")
    }

    /// `IP=a,b` as a list of raw strings (the caller parses and reports errors).
    pub fn ips(&self) -> Vec<&str> {
        self.get_nonempty("IP")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn mac(&self) -> Option<&str> {
        self.get_nonempty("MAC")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_multus_style_args_with_duplicates() {
        let a = CniArgs::parse(
            "IgnoreUnknown=true;K8S_POD_NAMESPACE=hil;K8S_POD_NAME=proxy-0;\
             K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1;IgnoreUnknown=1;;IP=172.17.16.9/24, 10.1.0.2",
        );
        assert_eq!(a.get("IgnoreUnknown"), Some("1"));
        assert_eq!(a.pod_namespace(), Some("hil"));
        assert_eq!(a.pod_name(), Some("proxy-0"));
        assert_eq!(a.pod_uid(), Some("u-1"));
        assert_eq!(a.ips(), vec!["172.17.16.9/24", "10.1.0.2"]);
        assert!(a.malformed.is_empty());
        assert_eq!(a.pairs().len(), 7);
        assert_eq!(a.pairs()[0], ("IgnoreUnknown".into(), "true".into()));
    }

    #[test]
    fn keeps_values_with_equals_and_reports_malformed() {
        let a = CniArgs::parse("A=b=c;junk; ;K8S_POD_NAME=");
        assert_eq!(a.get("A"), Some("b=c"));
        assert_eq!(a.malformed, vec!["junk".to_string()]);
        assert_eq!(a.pod_name(), None);
        assert!(CniArgs::parse("").ips().is_empty());
    }
}
