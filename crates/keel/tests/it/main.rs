//! Integration tests of the engine: one binary, one module per concern.

mod basics;
