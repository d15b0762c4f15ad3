//! homing's end-to-end test harness: real `homingd` processes for three DCs
//! (iad, fra, sin) on loopback, a real 3-member etcd as the global store, a
//! dev PKI, and UDP relays on every inter-DC path to add latency or cut a DC
//! off. See [`cluster::Cluster`]; the scenarios live in `tests/`, and
//! [`event_log::Ledger`] checks a DC's lifecycle event log against what a
//! workload was acknowledged. [`lone_dc::LoneDc`] is a deployment of one DC
//! with no etcd, for the `homing hold` tests. [`edge`] runs real
//! `edge-router` and `actor-host` processes beside a cluster, and
//! [`frozen::Frozen`] freezes a process (SIGSTOP) until dropped.
//!
//! The binaries are not built by the tests: run [`BUILD_HOMINGD`] first
//! (with the same `CARGO_TARGET_DIR`), or set `HOMINGD_BIN`, `HOMING_BIN`,
//! `EDGE_ROUTER_BIN` and `ACTOR_HOST_BIN`.

#[cfg(feature = "etcd")]
pub mod cluster;
#[cfg(feature = "etcd")]
pub mod edge;
pub mod event_log;
#[cfg(feature = "etcd")]
pub mod frozen;
#[cfg(feature = "etcd")]
pub mod homingd;
#[cfg(feature = "etcd")]
pub mod lone_dc;

#[cfg(feature = "etcd")]
pub use cluster::{Cluster, ClusterOptions, start_or_skip};
#[cfg(feature = "etcd")]
pub use homing_store::etcd_cluster::LocalEtcdCluster;
#[cfg(feature = "etcd")]
pub use homingd::{
    BUILD_HOMINGD, DcStoreSpec, GlobalStoreSpec, Homingd, HomingdSpec, homing_binary,
    homingd_binary,
};

/// Without feature `etcd` there is no harness: say how to run the suite.
#[cfg(all(test, not(feature = "etcd")))]
mod without_etcd {
    #[test]
    fn e2e_suite_needs_feature_etcd() {
        println!(
            "SKIPPED homing-e2e: run `cargo build -p homing-daemon -p homing-cli -p homing-edge --features etcd \
             --bin homingd --bin homing --bin edge-router --bin actor-host` \
             then `cargo test -p homing-e2e --features etcd -- --test-threads=2` (needs protoc and etcd)"
        );
    }
}
