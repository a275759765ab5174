//! What the API answers, as one type from where it is decided to where it
//! is counted: [`Code`], every `error` code of an error's body, and
//! [`Outcome`], an order's answer (accepted, replayed, or refused with a
//! code). The HTTP layer gives each code its status (`http::error`); the
//! metrics, the sale's timeline and the dashboard count outcomes by them.
//! None of them matches a string: adding a code here makes the compiler
//! name every place that must decide about it.

/// Declares [`Code`]: each code once, with its text and its class.
macro_rules! codes {
    ($($variant:ident = $text:literal, $class:ident;)*) => {
        /// Every `error` code the API answers: the body's `error` field, and
        /// the list the OpenAPI document gives.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code {
            $($variant),*
        }

        impl Code {
            pub const ALL: &[Code] = &[$(Code::$variant),*];

            /// The code as the body's `error` field, the metrics' `outcome`
            /// label and docs/api.md write it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $text),*
                }
            }

            /// The name an order refused with this code counts under in a
            /// sale's timeline and its report: `refused.<code>`.
            pub const fn refused_name(self) -> &'static str {
                match self {
                    $(Code::$variant => concat!("refused.", $text)),*
                }
            }

            /// Whether the answer refuses the order, or sheds it unheard.
            pub const fn class(self) -> Class {
                match self {
                    $(Code::$variant => Class::$class),*
                }
            }
        }
    };
}

codes! {
    InvalidRequest = "invalid_request", Refused;
    Unauthorized = "unauthorized", Refused;
    Forbidden = "forbidden", Refused;
    AdmissionRequired = "admission_required", Refused;
    AdmissionExpired = "admission_expired", Refused;
    ChallengeRequired = "challenge_required", Refused;
    NotFound = "not_found", Refused;
    ProductNotFound = "product_not_found", Refused;
    OrderNotFound = "order_not_found", Refused;
    InvalidSignature = "invalid_signature", Refused;
    OrderPending = "order_pending", Refused;
    AmountMismatch = "amount_mismatch", Refused;
    PaymentIdReused = "payment_id_reused", Refused;
    NoWaitingRoom = "no_waiting_room", Refused;
    TicketNotFound = "ticket_not_found", Refused;
    MethodNotAllowed = "method_not_allowed", Refused;
    RequestTimeout = "request_timeout", Refused;
    ProductExists = "product_exists", Refused;
    SaleNotStarted = "sale_not_started", Refused;
    SaleEnded = "sale_ended", Refused;
    SalePaused = "sale_paused", Refused;
    SaleClosed = "sale_closed", Refused;
    SoldOut = "sold_out", Refused;
    InsufficientStock = "insufficient_stock", Refused;
    LimitExceeded = "limit_exceeded", Refused;
    InvalidTransition = "invalid_transition", Refused;
    QueueNotOpen = "queue_not_open", Refused;
    PayloadTooLarge = "payload_too_large", Refused;
    UnsupportedMediaType = "unsupported_media_type", Refused;
    IdempotencyKeyReused = "idempotency_key_reused", Refused;
    RateLimited = "rate_limited", Shed;
    HeadersTooLarge = "headers_too_large", Refused;
    Internal = "internal", Refused;
    Overloaded = "overloaded", Shed;
    Unavailable = "unavailable", Refused;
}

/// The names of refused outcomes in a sale's timeline start so
/// ([`Code::refused_name`]); the report lists them by it.
pub const REFUSED_PREFIX: &str = "refused.";

impl Code {
    /// The code written `text` (a metrics label read back).
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.as_str() == text)
    }
}

/// An order's answer by what it did: the order path's latency classes
/// (`flashsale_order_latency_seconds{class}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A new order taken, or a retry answered with its first answer.
    Accepted,
    /// The sale (or the service, for the request) said no.
    Refused,
    /// Not heard: the service is at capacity or the caller over its rate.
    Shed,
}

impl Class {
    pub const ALL: [Class; 3] = [Class::Accepted, Class::Refused, Class::Shed];

    pub const fn label(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Refused => "refused",
            Self::Shed => "shed",
        }
    }
}

/// The answer to `POST /api/orders`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A new order: 202.
    Accepted,
    /// A retry of an order with its key: its first answer again.
    Replayed,
    /// Refused with this code (or shed: [`Code::class`]).
    Refused(Code),
}

impl Outcome {
    /// How many outcomes there are: [`Outcome::index`] is below it.
    pub const COUNT: usize = 2 + Code::ALL.len();

    /// A dense index, for tables of series resolved once each.
    pub fn index(self) -> usize {
        match self {
            Self::Accepted => 0,
            Self::Replayed => 1,
            Self::Refused(code) => 2 + code as usize,
        }
    }

    /// The metrics' `outcome` label: `accepted`, `replayed` or the code.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Replayed => "replayed",
            Self::Refused(code) => code.as_str(),
        }
    }

    /// The name a sale's timeline counts it under, and its report reads
    /// back: `accepted`, `replayed` or `refused.<code>`.
    pub const fn timeline_name(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Replayed => "replayed",
            Self::Refused(code) => code.refused_name(),
        }
    }

    pub const fn class(self) -> Class {
        match self {
            Self::Accepted | Self::Replayed => Class::Accepted,
            Self::Refused(code) => code.class(),
        }
    }

    /// The outcome whose label is `label` (a metrics label read back).
    pub fn parse(label: &str) -> Option<Self> {
        match label {
            "accepted" => Some(Self::Accepted),
            "replayed" => Some(Self::Replayed),
            code => Code::parse(code).map(Self::Refused),
        }
    }

    /// Every outcome, in [`Outcome::index`] order.
    pub fn all() -> impl Iterator<Item = Outcome> {
        [Self::Accepted, Self::Replayed]
            .into_iter()
            .chain(Code::ALL.iter().copied().map(Self::Refused))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_has_its_own_index_label_and_name_and_reads_back() {
        let all: Vec<Outcome> = Outcome::all().collect();
        assert_eq!(all.len(), Outcome::COUNT);
        for (i, o) in all.iter().enumerate() {
            assert_eq!(o.index(), i);
            assert_eq!(Outcome::parse(o.label()), Some(*o));
        }
        let mut labels: Vec<&str> = all.iter().map(|o| o.label()).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), Outcome::COUNT);
        assert_eq!(
            Outcome::Refused(Code::SoldOut).timeline_name(),
            "refused.sold_out"
        );
        assert_eq!(Outcome::Replayed.timeline_name(), "replayed");
        assert_eq!(Outcome::parse("refused.sold_out"), None);
        for code in Code::ALL {
            assert_eq!(
                code.refused_name().strip_prefix(REFUSED_PREFIX),
                Some(code.as_str())
            );
        }
    }

    #[test]
    fn shed_answers_are_the_capacity_and_the_rate() {
        let shed: Vec<Code> = Code::ALL
            .iter()
            .copied()
            .filter(|c| c.class() == Class::Shed)
            .collect();
        assert_eq!(shed, [Code::RateLimited, Code::Overloaded]);
        assert_eq!(Outcome::Replayed.class(), Class::Accepted);
    }
}
