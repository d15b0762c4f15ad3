//! homing-sim binary: being written.
fn main() {}
