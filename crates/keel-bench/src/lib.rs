//! Benchmark harness (placeholder until the harness lands).
