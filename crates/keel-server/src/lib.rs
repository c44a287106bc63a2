//! RESP server over tokio (being built).
