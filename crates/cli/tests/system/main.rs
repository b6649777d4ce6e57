//! The tests that run `interlock` as a process: servers, clients, the
//! CLI, and mounts of real file systems used by real programs. One module
//! per subject; `cargo test -p interlock --test system -- mount::` runs
//! one of them, `-- mount::fsx` one test.
//!
//! They are one test binary rather than a binary per file because each
//! binary links the client, the runtime and the shared helpers anew: as
//! ten binaries their release build took 2 min 08 s of a 2-core machine,
//! as one 1 min 12 s, and the tests, run side by side, finish sooner too
//! (167 s against 202 s one binary after another).

mod common;

mod cli;
mod faults;
mod fuzz;
mod meta;
mod mount;
mod ops;
mod resume;
mod safety;
mod server;
mod tls;
