//! homing-store: being written (see issue).
