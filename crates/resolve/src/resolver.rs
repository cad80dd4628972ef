//! The per-netns resolver: a lookup of A and AAAA through the search list,
//! answered from a TTL cache while the answer lasts, forgotten on request.
//!
//! It holds no socket and no thread: queries go out on sockets from
//! [`DnsSockets`], on the caller's tokio runtime.

use crate::exchange::{ask, Answer, Failure};
use crate::{DnsSockets, ResolvConf, ResolveError};
use futures_util::future::{BoxFuture, FutureExt, Shared};
use hickory_proto::rr::{Name, RecordType};
use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// An answer is kept at least this long...
const MIN_TTL: Duration = Duration::from_secs(1);
/// ... and at most this long, whatever the record says.
const MAX_TTL: Duration = Duration::from_secs(3600);
/// A negative answer (NXDOMAIN, no address) is kept at most this long.
const MAX_NEGATIVE_TTL: Duration = Duration::from_secs(5);
/// An IP literal's answer never expires (~30 years).
const FOREVER: Duration = Duration::from_secs(30 * 365 * 86400);

/// The addresses a name resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// IPv4 first, then IPv6, each in the server's order.
    pub addrs: Vec<IpAddr>,
    /// When the answer expires (the least TTL of the answer chain, clamped
    /// to 1 s ..= 1 h, from when it arrived).
    pub valid_until: Instant,
    /// The name that answered, after the search list, without the trailing
    /// dot (the host itself for an IP literal).
    pub name: String,
}

#[derive(Debug, Clone)]
enum Cached {
    Found(Resolved),
    /// NXDOMAIN (`nx`) or no address records, until `until`.
    Negative {
        nx: bool,
        tried: String,
        until: Instant,
    },
}

/// One per pod netns; Send + Sync; cheap to share in an Arc.
///
/// Concurrent lookups of one name share one resolution (a task of its
/// own, so it finishes and fills the cache even when the callers give up).
/// `lookup` must run on a tokio runtime.
pub struct Resolver {
    inner: Arc<Inner>,
}

struct Inner {
    conf: ResolvConf,
    sockets: Arc<dyn DnsSockets>,
    cache: Mutex<HashMap<String, Cached>>,
    inflight: Mutex<Inflight>,
}

/// The resolutions under way, by cache key, each with a number so that
/// only its own task removes it.
#[derive(Default)]
struct Inflight {
    next: u64,
    flights: HashMap<String, (u64, Flight)>,
}

type Flight = Shared<BoxFuture<'static, Result<Resolved, Arc<ResolveError>>>>;

/// Lock a map; a panic elsewhere while holding it left a map, not a broken
/// invariant: keep using it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Resolver {
    pub fn new(conf: ResolvConf, sockets: Arc<dyn DnsSockets>) -> Resolver {
        Resolver {
            inner: Arc::new(Inner {
                conf,
                sockets,
                cache: Mutex::new(HashMap::new()),
                inflight: Mutex::new(Inflight::default()),
            }),
        }
    }

    pub fn conf(&self) -> &ResolvConf {
        &self.inner.conf
    }

    /// A and AAAA of `host` (search list / ndots applied like glibc;
    /// "name." is absolute; an IP literal returns itself with no expiry),
    /// answered from the cache while the TTL lasts. CNAME chains are
    /// followed within the answer.
    pub async fn lookup(&self, host: &str) -> Result<Resolved, ResolveError> {
        let literal = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = literal.parse::<IpAddr>() {
            let now = Instant::now();
            return Ok(Resolved {
                addrs: vec![ip],
                valid_until: now.checked_add(FOREVER).unwrap_or(now),
                name: host.to_string(),
            });
        }
        let key = host.to_ascii_lowercase();
        if let Some(hit) = self.inner.cached(&key, host) {
            return hit;
        }
        self.flight(&key, host).await.map_err(|e| copy_error(&e))
    }

    /// Forget the cached answer for `host` (the daemon calls it after a
    /// connect to the address failed).
    pub fn forget(&self, host: &str) {
        lock(&self.inner.cache).remove(&host.to_ascii_lowercase());
    }

    /// The resolution of `key` under way, or a new one.
    fn flight(&self, key: &str, host: &str) -> Flight {
        let mut inflight = lock(&self.inner.inflight);
        if let Some((_, flight)) = inflight.flights.get(key) {
            return flight.clone();
        }
        let number = inflight.next;
        inflight.next += 1;
        let inner = self.inner.clone();
        let (k, h) = (key.to_string(), host.to_string());
        let task = tokio::spawn(async move {
            let result = inner.resolve_and_cache(&k, &h).await;
            let mut inflight = lock(&inner.inflight);
            if inflight.flights.get(&k).is_some_and(|(n, _)| *n == number) {
                inflight.flights.remove(&k);
            }
            result.map_err(Arc::new)
        });
        let host = host.to_string();
        let flight = async move {
            task.await.unwrap_or_else(|e| {
                Err(Arc::new(ResolveError::Io {
                    what: format!("the lookup of {host:?}"),
                    source: io::Error::other(e.to_string()),
                }))
            })
        }
        .boxed()
        .shared();
        inflight
            .flights
            .insert(key.to_string(), (number, flight.clone()));
        flight
    }
}

impl Inner {
    /// Resolve `host` and cache the answer (and a negative one briefly).
    async fn resolve_and_cache(&self, key: &str, host: &str) -> Result<Resolved, ResolveError> {
        let (result, until) = self.resolve(host).await;
        let entry = match &result {
            Ok(r) => Some(Cached::Found(r.clone())),
            Err(ResolveError::NxDomain { tried, .. }) => until.map(|until| Cached::Negative {
                nx: true,
                tried: tried.clone(),
                until,
            }),
            Err(ResolveError::NoRecords { tried, .. }) => until.map(|until| Cached::Negative {
                nx: false,
                tried: tried.clone(),
                until,
            }),
            Err(_) => None,
        };
        if let Some(entry) = entry {
            lock(&self.cache).insert(key.to_string(), entry);
        }
        result
    }

    /// The cached answer for `key`, if still valid (expired ones are
    /// dropped).
    fn cached(&self, key: &str, host: &str) -> Option<Result<Resolved, ResolveError>> {
        let mut cache = lock(&self.cache);
        let now = Instant::now();
        let hit = match cache.get(key)? {
            Cached::Found(r) if r.valid_until > now => Ok(r.clone()),
            Cached::Negative { nx, tried, until } if *until > now => {
                let (host, tried) = (host.to_string(), tried.clone());
                Err(if *nx {
                    ResolveError::NxDomain { host, tried }
                } else {
                    ResolveError::NoRecords { host, tried }
                })
            }
            _ => {
                cache.remove(key);
                return None;
            }
        };
        Some(hit)
    }

    /// Ask the servers, candidate after candidate; the result and, for a
    /// negative one, until when it may be cached.
    async fn resolve(&self, host: &str) -> (Result<Resolved, ResolveError>, Option<Instant>) {
        let candidates = self.conf.candidates(host);
        let mut bad: Option<ResolveError> = None;
        let mut nodata = false;
        let mut negative_ttl = u32::MAX;
        let mut tried: Vec<&str> = Vec::new();
        for cand in &candidates {
            let qname = match Name::from_ascii(cand) {
                Ok(n) => n,
                Err(e) => {
                    return (
                        Err(ResolveError::BadName {
                            host: host.to_string(),
                            reason: e.to_string(),
                        }),
                        None,
                    )
                }
            };
            tried.push(cand);
            let started = Instant::now();
            let sockets = &*self.sockets;
            let (a, aaaa) = futures_util::future::join(
                ask(&self.conf, sockets, &qname, RecordType::A),
                ask(&self.conf, sockets, &qname, RecordType::AAAA),
            )
            .await;
            let mut addrs = Vec::new();
            let mut ttl = u32::MAX;
            let mut nx = true;
            let mut failure = None;
            for answer in [a, aaaa] {
                match answer {
                    Ok(Answer::Addrs {
                        addrs: found,
                        ttl: t,
                    }) => {
                        addrs.extend(found);
                        ttl = ttl.min(t);
                        nx = false;
                    }
                    Ok(Answer::NxDomain { ttl: t }) => negative_ttl = negative_ttl.min(t),
                    Ok(Answer::NoData { ttl: t }) => {
                        negative_ttl = negative_ttl.min(t);
                        nx = false;
                    }
                    Err(f) => {
                        nx = false;
                        failure = Some(f);
                    }
                }
            }
            if !addrs.is_empty() {
                let ttl = Duration::from_secs(u64::from(ttl)).clamp(MIN_TTL, MAX_TTL);
                return (
                    Ok(Resolved {
                        addrs,
                        valid_until: started + ttl,
                        name: cand.trim_end_matches('.').to_string(),
                    }),
                    None,
                );
            }
            match failure {
                // No answer at all: glibc stops searching here too (the
                // next name would time out the same way).
                Some(Failure::Timeout) => {
                    return (Err(self.timeout(host)), None);
                }
                Some(Failure::Io { server, source }) => {
                    return (
                        Err(ResolveError::Query {
                            host: host.to_string(),
                            server,
                            source,
                        }),
                        None,
                    );
                }
                // SERVFAIL and the like: on to the next name, as glibc.
                Some(Failure::Bad { server, reason }) => {
                    bad = Some(ResolveError::BadAnswer {
                        host: host.to_string(),
                        server,
                        reason,
                    });
                }
                None if !nx => nodata = true,
                None => {}
            }
        }
        if let Some(bad) = bad {
            return (Err(bad), None);
        }
        let tried = tried.join(", ");
        let host = host.to_string();
        let err = if nodata {
            ResolveError::NoRecords { host, tried }
        } else {
            ResolveError::NxDomain { host, tried }
        };
        let keep = Duration::from_secs(u64::from(negative_ttl)).min(MAX_NEGATIVE_TTL);
        let until = (!keep.is_zero()).then(|| Instant::now() + keep);
        (Err(err), until)
    }

    fn timeout(&self, host: &str) -> ResolveError {
        ResolveError::Timeout {
            host: host.to_string(),
            servers: self
                .conf
                .nameservers
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            attempts: self.conf.attempts,
            timeout_ms: self.conf.timeout.as_millis(),
        }
    }
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("conf", &self.inner.conf)
            .finish_non_exhaustive()
    }
}

/// A copy of an error shared by the callers of one resolution (an I/O
/// error keeps its kind and text).
fn copy_error(e: &ResolveError) -> ResolveError {
    use ResolveError as E;
    let io = |e: &io::Error| io::Error::new(e.kind(), e.to_string());
    match e {
        E::Conf { line, text, reason } => E::Conf {
            line: *line,
            text: text.clone(),
            reason: reason.clone(),
        },
        E::ConfValue { value, reason } => E::ConfValue {
            value: value.clone(),
            reason: reason.clone(),
        },
        E::NoNameserver => E::NoNameserver,
        E::ConfFile { path, source } => E::ConfFile {
            path: path.clone(),
            source: Box::new(copy_error(source)),
        },
        E::BadName { host, reason } => E::BadName {
            host: host.clone(),
            reason: reason.clone(),
        },
        E::NxDomain { host, tried } => E::NxDomain {
            host: host.clone(),
            tried: tried.clone(),
        },
        E::NoRecords { host, tried } => E::NoRecords {
            host: host.clone(),
            tried: tried.clone(),
        },
        E::Timeout {
            host,
            servers,
            attempts,
            timeout_ms,
        } => E::Timeout {
            host: host.clone(),
            servers: servers.clone(),
            attempts: *attempts,
            timeout_ms: *timeout_ms,
        },
        E::BadAnswer {
            host,
            server,
            reason,
        } => E::BadAnswer {
            host: host.clone(),
            server: *server,
            reason: reason.clone(),
        },
        E::Query {
            host,
            server,
            source,
        } => E::Query {
            host: host.clone(),
            server: *server,
            source: io(source),
        },
        E::Io { what, source } => E::Io {
            what: what.clone(),
            source: io(source),
        },
    }
}
