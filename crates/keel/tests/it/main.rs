//! Integration tests of the engine: one binary, one module per concern.

mod basics;
mod concurrent;
mod history;
