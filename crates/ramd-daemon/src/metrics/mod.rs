//! The Prometheus endpoint (`[daemon] metrics = "ADDR"`, `--metrics ADDR`):
//! `GET /metrics` renders the daemon's and each disk's status in the
//! OpenMetrics text format.
//!
//! - [`openmetrics`]: the text of one scrape, read from the status structs;
//! - [`http`]: the listener and its small HTTP/1.1 responder.

pub mod http;
pub mod openmetrics;

pub use http::{parse_addr, url, MetricsServer, Source, MAX_CLIENTS};
pub use openmetrics::render;
