//! Third review (issue 20), items 8, 22, 23: who may join a forward's listener, a queued client's half-close, a client that leaves during the connect.
