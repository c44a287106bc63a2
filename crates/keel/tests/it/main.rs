//! Integration tests of the engine: one binary, one module per concern.

mod bank;
mod basics;
mod concurrent;
mod gc;
mod history;
mod index_growth;
mod limits;
mod model;
mod prepare;
mod reclaim;
mod split;
mod track;
mod write_skew;
