//! What the operator's views (`/metrics`, the dashboard's board) read of
//! the sales: the calls this process sent, the open sales, each one's
//! queue and room. Read-only.

use std::sync::Arc;

use crate::sale::{Counts, Lifecycle, Queue, Room, Sales};

/// The handles the operator's views read.
#[derive(Clone)]
pub struct Watched {
    counts: Arc<Counts>,
    lifecycle: Lifecycle,
    queue: Queue,
    room: Room,
}

impl Watched {
    pub fn of(sales: &Sales) -> Self {
        Self {
            counts: sales.counts(),
            lifecycle: sales.lifecycle().clone(),
            queue: sales.queue().clone(),
            room: sales.room().clone(),
        }
    }
}

impl Watched {
    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// The registry of open sales.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    pub fn room(&self) -> &Room {
        &self.room
    }
}
