//! The one way a step of a reconcile fails: an API call, named. Its own
//! module so that the caches (`run::caches`) and the context
//! (`run::context`, which holds them) both use it without importing each
//! other.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
}

pub(crate) fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}
