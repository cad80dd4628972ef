//! Third review (issue 20), item 5: a pod with two edgelink attachments does not bridge its segments.
