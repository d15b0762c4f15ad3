//! `DcId`: the name of a datacenter, the prefix of every reservation it owns.

use crate::label::{Alphabet, LabelRule, label_type};

/// Longest DC id, in bytes.
pub const DC_ID_BYTES_MAX: usize = 32;

fn dc_id_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
}

const DC_ID_RULE: LabelRule = LabelRule {
    what: "dc id",
    bytes_min: 1,
    bytes_max: DC_ID_BYTES_MAX,
    // No `.`: it separates the DC from the unique part of a reservation ID.
    alphabet: Some(Alphabet {
        allowed: dc_id_char,
        description: "[a-z0-9-] (no `.`, no upper case)",
    }),
    segmented: false,
};

label_type!(
    /// A datacenter: 1–32 characters of `[a-z0-9-]`, never a `.`.
    DcId,
    DC_ID_RULE
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::label::LabelError;

    #[test]
    fn dc_id_accepts_region_names() {
        for ok in ["iad", "fra-1", "ap-southeast-2", "0"] {
            assert_eq!(DcId::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn dc_id_rejects_each_rule_by_name() {
        assert!(matches!(
            DcId::new(""),
            Err(LabelError::Empty { what: "dc id" })
        ));
        assert!(matches!(
            DcId::new("a".repeat(33)),
            Err(LabelError::TooLong { max: 32, .. })
        ));
        assert!(matches!(
            DcId::new("ia.d"),
            Err(LabelError::Alphabet {
                found: '.',
                at: 2,
                ..
            })
        ));
        assert!(matches!(
            DcId::new("IAD"),
            Err(LabelError::Alphabet { found: 'I', .. })
        ));
        assert!(matches!(
            DcId::new("i\nd"),
            Err(LabelError::ControlCharacter { at: 1, .. })
        ));
        let message = DcId::new("ia.d").unwrap_err().to_string();
        assert!(
            message.contains("dc id") && message.contains("'.'"),
            "{message}"
        );
    }

    #[test]
    fn dc_id_serde_rejects_invalid_text() {
        let bytes = postcard::to_allocvec("NOT.OK").unwrap();
        assert!(postcard::from_bytes::<DcId>(&bytes).is_err());
    }
}
