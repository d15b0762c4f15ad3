//! `ReservationId`: one claim of a key by one DC, written `<dc>.<unique>`.
//! `unique` comes from the DC's durable allocator and is never reused, so two
//! IDs are equal only if they are the same claim — which is what makes chains
//! of reservation IDs loop-free where chains of DC names are not.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::dc::{DC_ID_BYTES_MAX, DcId};
use crate::label::LabelError;

/// Longest textual reservation ID: the DC, the dot, and a `u64` in decimal.
pub const RESERVATION_ID_BYTES_MAX: usize = DC_ID_BYTES_MAX + 1 + 20;

/// `<dc>.<unique>`: the DC that owns the reservation and its allocator value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ReservationId {
    dc: DcId,
    unique: u64,
}

impl ReservationId {
    /// The reservation `unique` of `dc`.
    pub fn new(dc: DcId, unique: u64) -> ReservationId {
        ReservationId { dc, unique }
    }

    /// The DC that owns this reservation and alone may change its record.
    pub fn dc(&self) -> &DcId {
        &self.dc
    }

    /// The allocator value, unique within the DC.
    pub fn unique(&self) -> u64 {
        self.unique
    }
}

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        ReservationRef::new(&self.dc, self.unique).fmt(f)
    }
}

/// A reservation ID by its parts, borrowed: written as its [`ReservationId`]
/// is, without one being built (for hot paths that hold the DC elsewhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservationRef<'a> {
    dc: &'a DcId,
    unique: u64,
}

impl<'a> ReservationRef<'a> {
    /// The reservation `unique` of `dc`.
    pub fn new(dc: &'a DcId, unique: u64) -> ReservationRef<'a> {
        ReservationRef { dc, unique }
    }

    /// The DC that owns the reservation.
    pub fn dc(&self) -> &'a DcId {
        self.dc
    }

    /// The allocator value, unique within the DC.
    pub fn unique(&self) -> u64 {
        self.unique
    }

    /// Whether this is `id`.
    pub fn is(&self, id: &ReservationId) -> bool {
        self.unique == id.unique && *self.dc == id.dc
    }

    /// As an owned ID.
    pub fn to_id(&self) -> ReservationId {
        ReservationId::new(self.dc.clone(), self.unique)
    }
}

impl fmt::Display for ReservationRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.dc, self.unique)
    }
}

fn invalid(input: &str, reason: &'static str) -> LabelError {
    // Keep hostile input from bloating logs.
    let input = input.chars().take(RESERVATION_ID_BYTES_MAX + 8).collect();
    LabelError::ReservationId { input, reason }
}

impl FromStr for ReservationId {
    type Err = LabelError;

    /// Parses the canonical form only (no sign, no leading zeros), so that
    /// parse and display are inverse and one reservation has one spelling.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() > RESERVATION_ID_BYTES_MAX {
            return Err(invalid(text, "longer than a dc id, a dot and a u64"));
        }
        let (dc, unique) = text
            .split_once('.')
            .ok_or_else(|| invalid(text, "missing the `.` between dc and unique"))?;
        let dc = DcId::new(dc)?;
        if unique.is_empty() || !unique.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid(text, "unique part must be decimal digits"));
        }
        if unique.len() > 1 && unique.starts_with('0') {
            return Err(invalid(text, "unique part must not have leading zeros"));
        }
        let unique = unique
            .parse::<u64>()
            .map_err(|_| invalid(text, "unique part overflows u64"))?;
        Ok(ReservationId { dc, unique })
    }
}

impl TryFrom<String> for ReservationId {
    type Error = LabelError;
    /// The serde path: a refusal is also noted for `wire::decode`'s error.
    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse().inspect_err(crate::label::note_refused)
    }
}

impl From<ReservationId> for String {
    fn from(id: ReservationId) -> String {
        id.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_canonical_form() {
        let id: ReservationId = "iad.42".parse().unwrap();
        assert_eq!(id.dc().as_str(), "iad");
        assert_eq!(id.unique(), 42);
        assert_eq!(id.to_string(), "iad.42");
    }

    #[test]
    fn rejects_each_malformed_shape_with_a_reason() {
        for (bad, reason) in [
            ("iad", "missing the `.`"),
            ("iad.", "decimal digits"),
            ("iad.-1", "decimal digits"),
            ("iad.+1", "decimal digits"),
            ("iad.007", "leading zeros"),
            ("iad.18446744073709551616", "overflows"),
            ("iad.1.2", "decimal digits"),
        ] {
            let err = bad.parse::<ReservationId>().unwrap_err().to_string();
            assert!(err.contains(reason), "{bad}: {err}");
        }
        assert!(matches!(
            ".1".parse::<ReservationId>(),
            Err(LabelError::Empty { what: "dc id" })
        ));
        assert!("IAD.1".parse::<ReservationId>().is_err());
    }

    #[test]
    fn serde_uses_the_string_form_and_validates_it() {
        let id: ReservationId = "fra.7".parse().unwrap();
        let bytes = postcard::to_allocvec(&id).unwrap();
        assert_eq!(postcard::to_allocvec("fra.7").unwrap(), bytes);
        let bad = postcard::to_allocvec("fra.07").unwrap();
        assert!(postcard::from_bytes::<ReservationId>(&bad).is_err());
    }

    proptest! {
        #[test]
        fn display_parse_round_trips(dc in "[a-z0-9-]{1,32}", unique in any::<u64>()) {
            let id = ReservationId::new(DcId::new(dc).unwrap(), unique);
            prop_assert_eq!(id.to_string().parse::<ReservationId>().unwrap(), id);
        }

        #[test]
        fn parse_never_panics_and_accepts_only_canonical_text(text in "\\PC{0,60}") {
            if let Ok(id) = text.parse::<ReservationId>() {
                prop_assert_eq!(id.to_string(), text);
            }
        }
    }
}
