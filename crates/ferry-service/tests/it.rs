//! ferry-service's integration tests, one binary: a real `ferry serve` (ferry-net's server) on
//! loopback, the service's scheduler and HTTP API in front of it.
