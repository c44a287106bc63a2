//! Compiles `csrc/long_double.c`: `INCRBYFLOAT` adds in the platform's C `long double`, as
//! Redis does (see `src/long_double.rs`).

fn main() {
    println!("cargo::rerun-if-changed=csrc/long_double.c");
    cc::Build::new()
        .file("csrc/long_double.c")
        .warnings(true)
        .compile("keel_long_double");
}
