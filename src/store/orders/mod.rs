//! `tb_order`, the persisted orders ([`Orders`]): one row per accepted
//! order, written by the stream workers ([`persist`]), changed by payments,
//! cancels and timeouts ([`transitions`]), read by the books.

mod persist;
mod read;
pub(crate) mod row;
pub(crate) mod transitions;

pub use persist::Persisted;
pub(crate) use row::order_rows;
pub use row::{OrderRow, Orders};
pub use transitions::Transition;
