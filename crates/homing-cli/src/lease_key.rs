//! Lease keys for the CLI's own acquires (`homing reserve`, the devnet's
//! story, the benchmarks): 128 bits from the operating system's secure
//! random source, as HostAgent draws them (DESIGN.md §7.3).

use homing_core::LeaseKey;
use ring::rand::SecureRandom;

/// A fresh random lease key.
pub fn random() -> anyhow::Result<LeaseKey> {
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| anyhow::anyhow!("the system random source failed"))?;
    LeaseKey::from_bytes(bytes).ok_or_else(|| anyhow::anyhow!("the random source returned zeros"))
}
