//! Third review (issue 20), items 1, 10, 11: what a NAD author may make the plugin touch on the node (the state directory, uplinks and bridges, another namespace's store).
