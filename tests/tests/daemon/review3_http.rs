//! Third review (issue 20), item 7: the status server under slow and unfinished requests.
