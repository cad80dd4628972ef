//! Third review (issue 20), items 15-18 and the read items 81, 82: ICMP errors, large datagrams, the answer before a reset, a client's reset while the device is not reading.
