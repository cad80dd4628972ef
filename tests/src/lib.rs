//! Test fixtures
