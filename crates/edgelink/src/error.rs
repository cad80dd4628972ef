//! The plugin's error type and its mapping onto CNI error codes.

use edgelink_attachment::RecordError;
use edgelink_cni_spec::{codes, CniError};
use edgelink_ipam::IpamError;
use edgelink_netlink::NetlinkError;
use edgelink_netns::NetnsError;

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("{0}")]
    Cni(CniError),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("{context}: {source}")]
    Netlink {
        context: String,
        source: NetlinkError,
    },
    #[error(transparent)]
    Ipam(#[from] IpamError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

impl From<CniError> for PluginError {
    fn from(e: CniError) -> Self {
        PluginError::Cni(e)
    }
}

/// Attach context to a netlink result.
pub trait NetlinkContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, PluginError>;
}

impl<T> NetlinkContext<T> for Result<T, NetlinkError> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, PluginError> {
        self.map_err(|source| PluginError::Netlink {
            context: context(),
            source,
        })
    }
}

impl PluginError {
    pub fn code(&self) -> u32 {
        match self {
            PluginError::Cni(e) => e.code,
            PluginError::Netns(NetnsError::NotFound { .. }) => codes::UNKNOWN_CONTAINER,
            PluginError::Netns(NetnsError::NotNetns { .. }) => codes::INVALID_ENV,
            PluginError::Netns(_) => codes::KERNEL,
            PluginError::Netlink { source, .. } if source.is_not_supported() => {
                codes::KERNEL_FEATURE_MISSING
            }
            PluginError::Netlink { .. } => codes::KERNEL,
            PluginError::Ipam(e) => match e {
                IpamError::Exhausted { .. } => codes::POOL_EXHAUSTED,
                IpamError::RequestedTaken { .. } | IpamError::RequestedOutOfRange { .. } => {
                    codes::ADDRESS_UNAVAILABLE
                }
                IpamError::LockTimeout { .. } => codes::TRY_AGAIN_LATER,
                // The network name is another namespace's on this node: the
                // config is wrong for this pod, a retry does not help.
                IpamError::NotOwner { .. } => codes::INVALID_CONFIG,
                _ => codes::IO_FAILURE,
            },
            PluginError::Record(_) | PluginError::Io { .. } => codes::IO_FAILURE,
        }
    }

    pub fn into_cni(self) -> CniError {
        match self {
            PluginError::Cni(e) => e,
            other => {
                let msg = match &other {
                    PluginError::Netns(NetnsError::NotFound { path }) => {
                        format!(
                            "CNI_NETNS {}: network namespace does not exist",
                            path.display()
                        )
                    }
                    PluginError::Netns(NetnsError::NotNetns { path, reason }) => format!(
                        "CNI_NETNS {}: not a network namespace ({reason})",
                        path.display()
                    ),
                    e => e.to_string(),
                };
                CniError::new(other.code(), msg)
            }
        }
    }
}

/// Collects errors during teardown so every step runs; reports them all.
#[derive(Debug, Default)]
pub struct Errors(pub Vec<PluginError>);

impl Errors {
    pub fn note<T>(&mut self, r: Result<T, impl Into<PluginError>>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                let e = e.into();
                tracing::warn!(error = %e, "teardown step failed");
                self.0.push(e);
                None
            }
        }
    }

    pub fn into_result(self) -> Result<(), PluginError> {
        let mut errs = self.0;
        match errs.len() {
            0 => Ok(()),
            1 => Err(errs.remove(0)),
            _ => {
                let code = errs[0].code();
                let msg = errs
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ");
                Err(PluginError::Cni(CniError::new(code, msg)))
            }
        }
    }
}
