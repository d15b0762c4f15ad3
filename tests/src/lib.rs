//! homing end-to-end test harness: being written.
