//! The [`GlobalStore`](crate::GlobalStore) cases on DC leases: renewal, marks,
//! expiry and retirement (DESIGN.md §7.5), and the DC-lease vocabulary the
//! succession cases share.

use homing_core::{DcId, DcLeaseState, DcMarks, DcRenewal, DcStanding, DcTerms};

use super::Backend;
use crate::global::GlobalStore;

pub(super) fn dc(name: &str) -> DcId {
    DcId::new(name).expect("valid dc id")
}

pub(super) fn marks(allocator_floor: u64, token_bound: u64) -> DcMarks {
    DcMarks {
        allocator_floor,
        token_bound,
        // Follows the allocator here, so the cases check it round-trips too.
        event_head: allocator_floor / 2,
    }
}

/// Terms whose lease lapses after 1 s and expires 1 s later (etcd rounds
/// its leases up to whole seconds and may raise a short one to its minimum).
pub(super) const SHORT_TERMS: DcTerms = DcTerms {
    ttl_ms: 1_000,
    host_lease_ttl_max_ms: 1_000,
    grace_ms: 0,
};

/// Terms that outlive any test.
pub(super) const LONG_TERMS: DcTerms = DcTerms {
    ttl_ms: 600_000,
    host_lease_ttl_max_ms: 10_000,
    grace_ms: 2_000,
};

/// Polls `dc`'s standing until `wanted` says yes, for at most 30 s.
pub(super) async fn standing_becomes(
    g: &dyn GlobalStore,
    dc: &DcId,
    what: &str,
    wanted: impl Fn(&DcStanding) -> bool,
) -> DcLeaseState {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let state = g.dc_lease(dc).await.unwrap();
        if wanted(&state.standing) {
            return state;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{dc} not {what} after 30 s: {state:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// dc lease: unknown until renewed; a renewal is live and publishes its
/// marks, which never go down; every DC is listed in id order.
pub async fn global_dc_lease_renews_and_keeps_the_highest_marks(b: &dyn Backend) {
    let place = "global_dc_lease_marks";
    let g = b.global_store(place).await;
    let (iad, fra) = (dc("iad"), dc("fra"));
    let unknown = g.dc_lease(&iad).await.unwrap();
    assert_eq!(unknown, DcLeaseState::unknown(iad.clone()));
    let renewed = g.renew_dc_lease(&iad, &LONG_TERMS, &marks(1024, 7)).await;
    assert_eq!(renewed.unwrap(), DcRenewal::Renewed(marks(1024, 7)));
    let state = g.dc_lease(&iad).await.unwrap();
    assert!(
        matches!(state.standing, DcStanding::Live { remaining_ms } if remaining_ms <= LONG_TERMS.ttl_ms && remaining_ms > LONG_TERMS.ttl_ms / 2),
        "{state:?}"
    );
    assert_eq!(
        (state.terms, state.marks, state.retired),
        (Some(LONG_TERMS), marks(1024, 7), false)
    );
    // Lower marks change nothing; each mark keeps its own maximum.
    let renewed = g.renew_dc_lease(&iad, &LONG_TERMS, &marks(10, 9)).await;
    assert_eq!(renewed.unwrap(), DcRenewal::Renewed(marks(1024, 9)));
    g.renew_dc_lease(&fra, &LONG_TERMS, &marks(1, 1))
        .await
        .unwrap();
    let all = g.dc_leases().await.unwrap();
    let names: Vec<&str> = all.iter().map(|s| s.dc.as_str()).collect();
    assert_eq!(names, ["fra", "iad"]);
    assert_eq!(all[1].marks, marks(1024, 9));
    if !b.durable() {
        return;
    }
    drop(g);
    let g = b.global_store(place).await;
    let state = g.dc_lease(&iad).await.unwrap();
    assert_eq!(state.marks, marks(1024, 9), "marks lost on reopen");
    assert!(
        !matches!(state.standing, DcStanding::Expired),
        "a reopened store must not call a lease expired early: {state:?}"
    );
}

/// dc lease: without renewals it lapses after its ttl and expires after
/// the longest host lease and grace more, by the store's clock; a renewal
/// makes it live again.
pub async fn global_dc_lease_lapses_then_expires_without_renewals(b: &dyn Backend) {
    let g = b.global_store("global_dc_lease_expiry").await;
    let iad = dc("iad");
    g.renew_dc_lease(&iad, &SHORT_TERMS, &marks(1, 1))
        .await
        .unwrap();
    let state = g.dc_lease(&iad).await.unwrap();
    assert!(
        matches!(
            state.standing,
            DcStanding::Live { .. } | DcStanding::Lapsed { .. }
        ),
        "{state:?}"
    );
    standing_becomes(g.as_ref(), &iad, "lapsed or expired", |s| {
        matches!(s, DcStanding::Lapsed { .. } | DcStanding::Expired)
    })
    .await;
    let expired =
        standing_becomes(g.as_ref(), &iad, "expired", |s| *s == DcStanding::Expired).await;
    assert_eq!(expired.marks, marks(1, 1), "expiry keeps the marks");
    g.renew_dc_lease(&iad, &LONG_TERMS, &marks(1, 1))
        .await
        .unwrap();
    let state = g.dc_lease(&iad).await.unwrap();
    assert!(
        matches!(state.standing, DcStanding::Live { .. }),
        "{state:?}"
    );
}

/// dc lease: a retired DC's renewals are refused from then on, also after
/// reopen; retiring keeps its marks and is idempotent.
pub async fn global_dc_retired_is_refused_for_good(b: &dyn Backend) {
    let place = "global_dc_retire";
    let g = b.global_store(place).await;
    let iad = dc("iad");
    g.renew_dc_lease(&iad, &LONG_TERMS, &marks(2048, 3))
        .await
        .unwrap();
    let retired = g.retire_dc(&iad).await.unwrap();
    assert!(retired.retired);
    assert_eq!(retired.marks, marks(2048, 3));
    assert_eq!(g.retire_dc(&iad).await.unwrap().marks, marks(2048, 3));
    let renewal = g.renew_dc_lease(&iad, &LONG_TERMS, &marks(4096, 3)).await;
    assert_eq!(renewal.unwrap(), DcRenewal::Retired);
    assert_eq!(g.dc_lease(&iad).await.unwrap().marks, marks(2048, 3));
    // A DC never heard of can be retired too (its id is then never served).
    assert!(g.retire_dc(&dc("never")).await.unwrap().retired);
    if !b.durable() {
        return;
    }
    drop(g);
    let g = b.global_store(place).await;
    let renewal = g.renew_dc_lease(&iad, &LONG_TERMS, &marks(4096, 3)).await;
    assert_eq!(
        renewal.unwrap(),
        DcRenewal::Retired,
        "retirement lost on reopen"
    );
}
