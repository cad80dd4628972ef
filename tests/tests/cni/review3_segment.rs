//! Third review (issue 20), items 2, 3, 4, 9: the segment never becomes a route (forwarding in the pod and on the node, the bridge's IPv6 link-local address).
