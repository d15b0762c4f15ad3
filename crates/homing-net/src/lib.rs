//! homing-net: being written (see issue).
