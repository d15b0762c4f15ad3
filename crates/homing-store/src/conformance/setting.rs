//! The [`GlobalStore`](crate::GlobalStore) cases on deployment settings:
//! setting and swap_setting (compare-and-set on opaque bytes).

use super::{Backend, RACERS, key, rid};
use crate::error::StoreError;
use crate::global::SetIfAbsent;
use crate::setting::{SETTING_BYTES_MAX, Setting};

/// settings: a setting never set reads `None`; a swap from `None` sets it;
/// a swap with the wrong expectation (`None`, another value, the empty
/// value) answers what is held and changes nothing; a swap with the right
/// one changes it, also to the empty value, which is held, not unset; a
/// retry of an applied swap answers the value it wrote; the value is
/// there after reopen.
pub async fn global_setting_is_changed_only_by_a_matching_swap(b: &dyn Backend) {
    let place = "global_setting_swap";
    let g = b.global_store(place).await;
    let name = Setting::DeploymentVersion;
    assert_eq!(g.setting(name).await.unwrap(), None);
    assert_eq!(g.swap_setting(name, None, b"7").await.unwrap(), Ok(()));
    assert_eq!(g.setting(name).await.unwrap(), Some(b"7".to_vec()));
    let held = Err(Some(b"7".to_vec()));
    for wrong in [None, Some(&b"6"[..]), Some(&b"77"[..]), Some(&b""[..])] {
        assert_eq!(
            g.swap_setting(name, wrong, b"8").await.unwrap(),
            held,
            "a swap expecting {wrong:?}"
        );
        assert_eq!(g.setting(name).await.unwrap(), Some(b"7".to_vec()));
    }
    assert_eq!(
        g.swap_setting(name, Some(b"7"), b"8").await.unwrap(),
        Ok(())
    );
    assert_eq!(g.setting(name).await.unwrap(), Some(b"8".to_vec()));
    // A retry of the swap that was applied finds its own value.
    assert_eq!(
        g.swap_setting(name, Some(b"7"), b"8").await.unwrap(),
        Err(Some(b"8".to_vec()))
    );
    assert_eq!(g.swap_setting(name, Some(b"8"), b"").await.unwrap(), Ok(()));
    assert_eq!(g.setting(name).await.unwrap(), Some(Vec::new()));
    assert_eq!(
        g.swap_setting(name, None, b"9").await.unwrap(),
        Err(Some(Vec::new())),
        "the empty value is held, not unset"
    );
    assert_eq!(g.swap_setting(name, Some(b""), b"9").await.unwrap(), Ok(()));
    if !b.durable() {
        return;
    }
    drop(g);
    let g = b.global_store(place).await;
    assert_eq!(
        g.setting(name).await.unwrap(),
        Some(b"9".to_vec()),
        "setting lost on reopen"
    );
}

/// settings: each setting is its own value — swapping one neither reads
/// nor changes another — and none shares a key with a global entry or a
/// succession named alike.
pub async fn global_settings_are_independent_of_each_other_and_of_entries(b: &dyn Backend) {
    let g = b.global_store("global_settings_independent").await;
    let (directory, version) = (Setting::Directory, Setting::DeploymentVersion);
    assert_eq!(
        g.swap_setting(directory, None, b"iad=10.0.1.1:7400")
            .await
            .unwrap(),
        Ok(())
    );
    assert_eq!(g.setting(version).await.unwrap(), None);
    assert_eq!(g.swap_setting(version, None, b"7").await.unwrap(), Ok(()));
    assert_eq!(
        g.swap_setting(version, Some(b"iad=10.0.1.1:7400"), b"8")
            .await
            .unwrap(),
        Err(Some(b"7".to_vec())),
        "judged against another setting's value"
    );
    assert_eq!(
        g.swap_setting(directory, Some(b"iad=10.0.1.1:7400"), b"fra=10.0.2.1:7400")
            .await
            .unwrap(),
        Ok(())
    );
    assert_eq!(g.setting(version).await.unwrap(), Some(b"7".to_vec()));
    assert_eq!(
        g.setting(directory).await.unwrap(),
        Some(b"fra=10.0.2.1:7400".to_vec())
    );
    for name in Setting::ALL {
        let entry = key("", name.name());
        assert_eq!(g.get(&entry).await.unwrap(), None, "{name}");
        assert_eq!(
            g.set_if_absent(&entry, &rid("iad.1")).await.unwrap(),
            SetIfAbsent::Inserted
        );
    }
    assert_eq!(g.setting(version).await.unwrap(), Some(b"7".to_vec()));
    assert_eq!(g.scan(None, 10).await.unwrap().len(), Setting::ALL.len());
}

/// settings: a value of [`SETTING_BYTES_MAX`] bytes is set and read back
/// whole; one byte more is refused with `SettingTooLarge`, naming the
/// setting, and nothing is written.
pub async fn global_setting_above_its_bound_is_refused(b: &dyn Backend) {
    let g = b.global_store("global_setting_bound").await;
    let name = Setting::Directory;
    let largest: Vec<u8> = (0..SETTING_BYTES_MAX).map(|i| (i % 251) as u8).collect();
    let over = vec![b'x'; SETTING_BYTES_MAX + 1];
    let refused = g.swap_setting(name, None, &over).await;
    assert!(
        matches!(
            refused,
            Err(StoreError::SettingTooLarge { setting, bytes, max })
                if setting == name && bytes == SETTING_BYTES_MAX + 1 && max == SETTING_BYTES_MAX
        ),
        "{refused:?}"
    );
    assert_eq!(g.setting(name).await.unwrap(), None, "a refused swap wrote");
    assert_eq!(g.swap_setting(name, None, &largest).await.unwrap(), Ok(()));
    assert_eq!(g.setting(name).await.unwrap(), Some(largest.clone()));
    let refused = g.swap_setting(name, Some(&largest), &over).await;
    assert!(
        matches!(refused, Err(StoreError::SettingTooLarge { .. })),
        "{refused:?}"
    );
    assert_eq!(g.setting(name).await.unwrap(), Some(largest));
}

/// settings: concurrent swaps from the same expected value (never set,
/// then the first round's winner) have exactly one winner per round, and
/// every loser is answered the winner's value.
pub async fn global_concurrent_setting_swaps_have_exactly_one_winner(b: &dyn Backend) {
    let g = b.global_store("global_setting_race").await;
    let name = Setting::Directory;
    let mut expected: Option<Vec<u8>> = None;
    for round in 0..2 {
        let tasks: Vec<_> = (0..RACERS)
            .map(|i| {
                let (g, expected) = (g.clone(), expected.clone());
                tokio::spawn(async move {
                    let value = format!("round {round} racer {i}").into_bytes();
                    let swapped = g.swap_setting(name, expected.as_deref(), &value).await;
                    (value, swapped.unwrap())
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut seen = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                (value, Ok(())) => winners.push(value),
                (_, Err(held)) => seen.push(held),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one winner");
        let winner = Some(winners.remove(0));
        assert!(
            seen.iter().all(|held| held == &winner),
            "round {round}: every loser is answered the winner's value"
        );
        assert_eq!(g.setting(name).await.unwrap(), winner);
        expected = winner;
    }
}

/// settings: a swap that landed but whose answer was lost is retried by
/// the store, whose retry fails its guard on the caller's own value: the
/// store answers that it set it (it did, once), and a later swap from the
/// old expectation is answered that value.
pub async fn global_setting_swap_whose_answer_was_lost_is_set_once(b: &dyn Backend) {
    let Some(lossy) = b
        .global_store_losing_next_answer("global_setting_lost_answer")
        .await
    else {
        println!("  skipped: this backend's writes cannot lose their answer");
        return;
    };
    let g = lossy.store;
    let name = Setting::DeploymentVersion;
    assert_eq!(g.swap_setting(name, None, b"7").await.unwrap(), Ok(()));
    assert!((lossy.lost)(), "the answer to the swap was not lost");
    assert_eq!(
        g.swap_setting(name, None, b"8").await.unwrap(),
        Err(Some(b"7".to_vec()))
    );
    assert_eq!(g.setting(name).await.unwrap(), Some(b"7".to_vec()));
    if let Some(failover) = g.failover() {
        let resolved = failover.total(crate::FailoverEvent::AmbiguousResolved);
        assert_eq!(resolved, 1, "the store counts the outcome it resolved");
    }
}
