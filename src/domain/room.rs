//! A sale's waiting room as an operator sets it: its settings at creation
//! ([`WaitingRoom`]), its bounds ([`RoomBounds`]) and a change of them
//! ([`BoundsChange`]), each checked here once, by the same rules.
//!
//! The words: the **pace** is how many places the room admits per second
//! now (`admit_per_sec` in the answers and metrics); the **ceiling** and
//! the **floor** are the operator's bounds on it (`ceiling_per_sec`,
//! `floor_per_sec`): the pace starts at the ceiling, halves towards the
//! floor while the backend is strained and climbs back. **No cap** is
//! `None` in the code; on the wire it is an absent field or `0` (JSON, the
//! room's hash in Redis) or NULL (MySQL), converted where it is read.

use super::valid::{Invalid, invalid};

/// Highest pace a room takes (its ceiling), buyers per second.
pub const MAX_PACE: u32 = 100_000;
/// Highest active cap a room takes.
pub const MAX_ACTIVE_CAP: u32 = 10_000_000;
/// Highest join difficulty (bits) a room takes: about 16 million hashes.
pub const MAX_JOIN_DIFFICULTY: u8 = 24;

/// A sale's waiting room: buyers join a line, early joiners are shuffled
/// at the start, and the room admits their places at its pace; with the
/// room on, only admitted buyers may order (see `sale::room`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct WaitingRoom {
    /// The ceiling: places admitted per second at most, the pace it starts
    /// at (1 to 100,000); changed live by `POST
    /// /api/admin/products/{id}/room`. Also accepted as `admit_per_sec`,
    /// its earlier name: deprecated (that is the pace's word), refused
    /// from 0.3.0.
    #[serde(alias = "admit_per_sec")]
    #[schema(minimum = 1, maximum = 100_000)]
    pub ceiling_per_sec: u32,
    /// The floor the pace drops to while the backend is strained (orders
    /// waiting to be persisted for more than 2 s): the pace halves each
    /// second down to it and climbs back to the ceiling when the strain
    /// clears. 1 to the ceiling; default a tenth of it (at least 1). Equal
    /// to the ceiling: a fixed pace. Also accepted as `admit_floor_per_sec`
    /// (deprecated, refused from 0.3.0).
    #[serde(
        default,
        alias = "admit_floor_per_sec",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 1, maximum = 100_000)]
    pub floor_per_sec: Option<u32>,
    /// At most this many buyers hold an admission they have not used yet
    /// (admitted within the last `admission_secs`, less the units sold
    /// since): no place is admitted while the cap is reached. Absent: no
    /// cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 10_000_000)]
    pub active_cap: Option<u32>,
    /// A proof of work before a join (bits of leading zeros asked of
    /// `SHA-256(challenge:user_id:nonce)`, about 2^bits hashes; 0 to 24;
    /// default 0: none). See `GET /api/sales/{id}/challenge`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 24)]
    pub join_difficulty: Option<u8>,
    /// How long an admission stays valid, in seconds (1 to 86,400; default 120).
    #[serde(default = "WaitingRoom::default_admission_secs")]
    #[schema(minimum = 1, maximum = 86_400)]
    pub admission_secs: u32,
    /// How long before the start buyers may join, in seconds (0 to 86,400;
    /// default 600). Everyone who joins before the start is in the shuffle.
    #[serde(default = "WaitingRoom::default_join_early_secs")]
    #[schema(minimum = 0, maximum = 86_400)]
    pub join_early_secs: u32,
}

/// A waiting room's bounds: the pace's ceiling and floor (buyers per
/// second), its active cap (`None`: none) and its join difficulty (bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct RoomBounds {
    pub ceiling: u32,
    pub floor: u32,
    pub cap: Option<u32>,
    pub join_difficulty: u8,
}

/// A change of a room's bounds, checked: each `None` is kept; `cap:
/// Some(None)` removes the cap.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BoundsChange {
    pub ceiling: Option<u32>,
    pub floor: Option<u32>,
    pub cap: Option<Option<u32>>,
    pub join_difficulty: Option<u8>,
}

impl WaitingRoom {
    fn default_admission_secs() -> u32 {
        120
    }

    fn default_join_early_secs() -> u32 {
        600
    }

    /// The pace's floor: as set, or a tenth of the ceiling (at least 1).
    pub fn floor(&self) -> u32 {
        self.floor_per_sec
            .unwrap_or((self.ceiling_per_sec / 10).max(1))
    }

    /// The room's bounds when it opens.
    pub fn bounds(&self) -> RoomBounds {
        RoomBounds {
            ceiling: self.ceiling_per_sec,
            floor: self.floor(),
            cap: self.active_cap,
            join_difficulty: self.join_difficulty.unwrap_or(0),
        }
    }

    /// Checks the settings (each field named as the request names it).
    pub fn validate(self) -> Result<Self, Invalid> {
        let field = |name: &str| format!("waiting_room.{name}");
        check_pace(self.ceiling_per_sec, &field("ceiling_per_sec"))?;
        if let Some(floor) = self.floor_per_sec {
            check_floor(floor, self.ceiling_per_sec, &field("floor_per_sec"))?;
        }
        if let Some(cap) = self.active_cap {
            check_cap(cap, &field("active_cap"), 1)?;
        }
        if let Some(bits) = self.join_difficulty {
            check_difficulty(bits, &field("join_difficulty"))?;
        }
        if self.admission_secs == 0 || self.admission_secs > 86_400 {
            return Err(invalid(
                "waiting_room.admission_secs must be between 1 and 86400",
            ));
        }
        if self.join_early_secs > 86_400 {
            return Err(invalid(
                "waiting_room.join_early_secs must be at most 86400",
            ));
        }
        Ok(self)
    }
}

impl BoundsChange {
    /// A change as the admin asks it: a cap of 0 removes the cap. `Err`
    /// when a bound is out of range, or none is given. (A floor above the
    /// ceiling is lowered to it when the change is applied: the other
    /// bound may be the room's own.)
    pub fn new(
        ceiling: Option<u32>,
        floor: Option<u32>,
        cap: Option<u32>,
        join_difficulty: Option<u8>,
    ) -> Result<Self, Invalid> {
        if let Some(ceiling) = ceiling {
            check_pace(ceiling, "ceiling_per_sec")?;
        }
        if let Some(floor) = floor {
            check_pace(floor, "floor_per_sec")?;
        }
        if let Some(cap) = cap {
            check_cap(cap, "active_cap", 0)?;
        }
        if let Some(bits) = join_difficulty {
            check_difficulty(bits, "join_difficulty")?;
        }
        let change = Self {
            ceiling,
            floor,
            cap: cap.map(|c| (c > 0).then_some(c)),
            join_difficulty,
        };
        if change == Self::default() {
            return Err(invalid(
                "give ceiling_per_sec, floor_per_sec, active_cap or join_difficulty",
            ));
        }
        Ok(change)
    }
}

fn check_pace(pace: u32, field: &str) -> Result<(), Invalid> {
    match pace {
        1..=MAX_PACE => Ok(()),
        _ => Err(invalid(format!("{field} must be between 1 and {MAX_PACE}"))),
    }
}

fn check_floor(floor: u32, ceiling: u32, field: &str) -> Result<(), Invalid> {
    match floor {
        f if f >= 1 && f <= ceiling => Ok(()),
        _ => Err(invalid(format!(
            "{field} must be between 1 and the ceiling"
        ))),
    }
}

/// `least`: 1 where a cap must be one (creation), 0 where 0 means none.
fn check_cap(cap: u32, field: &str, least: u32) -> Result<(), Invalid> {
    match cap {
        c if c >= least && c <= MAX_ACTIVE_CAP => Ok(()),
        _ if least == 0 => Err(invalid(format!(
            "{field} must be between 0 (none) and {MAX_ACTIVE_CAP}"
        ))),
        _ => Err(invalid(format!(
            "{field} must be between 1 and {MAX_ACTIVE_CAP}"
        ))),
    }
}

fn check_difficulty(bits: u8, field: &str) -> Result<(), Invalid> {
    match bits {
        0..=MAX_JOIN_DIFFICULTY => Ok(()),
        _ => Err(invalid(format!(
            "{field} must be between 0 and {MAX_JOIN_DIFFICULTY}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(ceiling: u32, floor: Option<u32>, cap: Option<u32>) -> WaitingRoom {
        WaitingRoom {
            ceiling_per_sec: ceiling,
            floor_per_sec: floor,
            active_cap: cap,
            join_difficulty: None,
            admission_secs: 120,
            join_early_secs: 600,
        }
    }

    #[test]
    fn a_room_and_a_change_are_checked_by_the_same_bounds() {
        assert!(
            room(MAX_PACE, Some(1), Some(MAX_ACTIVE_CAP))
                .validate()
                .is_ok()
        );
        for bad in [
            room(0, None, None),
            room(MAX_PACE + 1, None, None),
            room(10, Some(11), None),
            room(10, Some(0), None),
            room(10, None, Some(0)),
            room(10, None, Some(MAX_ACTIVE_CAP + 1)),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        assert_eq!(room(50, None, None).floor(), 5);
        // A change: 0 removes the cap; nothing to change is refused.
        let none = BoundsChange::new(None, None, Some(0), None).unwrap();
        assert_eq!(none.cap, Some(None));
        assert!(BoundsChange::new(None, None, None, None).is_err());
        assert!(BoundsChange::new(Some(MAX_PACE + 1), None, None, None).is_err());
        assert!(BoundsChange::new(None, Some(0), None, None).is_err());
        assert!(BoundsChange::new(None, None, Some(MAX_ACTIVE_CAP + 1), None).is_err());
        assert!(BoundsChange::new(None, None, None, Some(MAX_JOIN_DIFFICULTY + 1)).is_err());
    }

    #[test]
    fn the_earlier_field_names_are_still_accepted() {
        let earlier: WaitingRoom =
            serde_json::from_str(r#"{"admit_per_sec":40,"admit_floor_per_sec":4}"#).unwrap();
        assert_eq!(
            (earlier.ceiling_per_sec, earlier.floor_per_sec),
            (40, Some(4))
        );
        let now = serde_json::to_value(earlier).unwrap();
        assert_eq!(now["ceiling_per_sec"], 40);
        assert_eq!(now["floor_per_sec"], 4);
    }
}
