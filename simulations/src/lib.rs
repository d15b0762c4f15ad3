//! homing-sim: being written.
