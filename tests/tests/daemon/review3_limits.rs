//! Third review (issue 20), items 6, 13, 24 and the read items 80, 83: memory and descriptor bounds, records from another boot or namespace, queued clients of a removed attachment.
