//! [`Catalog`]: a sale's operations that touch both stores (open, pace,
//! close) and where a product stands (its row, and its stock in Redis or
//! its final figures).

use std::sync::Arc;

use super::error::BookkeepingError;
use crate::domain::{BoundsChange, ProductId, RoomBounds, now_ms};
use crate::sale::room::RoomState;
use crate::sale::{self, SaleSpec};
use crate::store::{self, FinalAudit, NewProduct, Product};

/// The settings a product's sale is opened with in Redis, with `stock` units.
pub fn sale_spec(product: &Product, stock: u64) -> SaleSpec {
    SaleSpec {
        stock,
        // A sale closed before its planned start keeps that start in the
        // books; its window in Redis is empty at its end.
        start_ms: product.start_time.min(product.end_time),
        end_ms: product.end_time,
        limit_per_user: product.limit_per_user.max(1) as u64,
        price: product.price,
        waiting_room: product.waiting_room(),
        paused_ms: product.paused,
        shards: u16::try_from(product.stock_shards).unwrap_or(1).max(1),
    }
}

/// What opening a sale did.
#[derive(Debug, Clone, Copy)]
pub struct SaleOpened {
    /// Units on sale in Redis.
    pub stock: u64,
    /// False when the sale was open already (nothing changed).
    pub opened: bool,
}

/// Where a product stands.
#[derive(Debug, Clone)]
pub struct ProductStatus {
    pub product: Product,
    /// Units left in Redis (`None`: not open there, or retired).
    pub stock: Option<u64>,
    /// A retired sale's figures, as recorded at its retirement.
    pub final_audit: Option<FinalAudit>,
}

/// Sales as an admin runs them, across MySQL and Redis.
#[derive(Clone)]
pub struct Catalog {
    lifecycle: sale::Lifecycle,
    /// The stock left in Redis.
    ledger: sale::Ledger,
    room: sale::Room,
    products: store::Products,
    /// A retired sale's final figures.
    audits: store::Audits,
}

impl Catalog {
    pub fn new(
        (lifecycle, ledger, room): (sale::Lifecycle, sale::Ledger, sale::Room),
        (products, audits): (store::Products, store::Audits),
    ) -> Self {
        Self {
            lifecycle,
            ledger,
            room,
            products,
            audits,
        }
    }

    /// Creates a product in MySQL (its sale opens with [`Catalog::open`]).
    pub async fn create(&self, new: &NewProduct) -> Result<Product, BookkeepingError> {
        let product = self.products.create(new).await?;
        tracing::info!(product_id = %new.product_id, "product created");
        Ok(product)
    }

    /// The product's row (`NoProduct`: none).
    pub async fn product(&self, id: &ProductId) -> Result<Product, BookkeepingError> {
        self.products
            .product(id)
            .await?
            .ok_or(BookkeepingError::NoProduct)
    }

    /// Opens the product's sale in Redis with the units MySQL has, then
    /// records it. Idempotent; a closed or retired sale never opens again.
    pub async fn open(&self, id: &ProductId) -> Result<SaleOpened, BookkeepingError> {
        let product = self.product(id).await?;
        if product.closed.is_some() || product.retired.is_some() {
            return Err(BookkeepingError::SaleClosed);
        }
        let spec = sale_spec(&product, product.available_qty.max(0) as u64);
        let (opened, stock) = self.lifecycle.open(id, &spec).await?;
        self.products.mark_opened(id).await?;
        if opened {
            tracing::info!(product_id = %id, stock, "sale opened");
        }
        Ok(SaleOpened { stock, opened })
    }

    /// Where the product stands: live stock from Redis, or for a retired
    /// sale (its Redis keys gone, or going) its final figures from the books.
    pub async fn status(&self, id: &ProductId) -> Result<ProductStatus, BookkeepingError> {
        let product = self.product(id).await?;
        self.status_of(id, product).await
    }

    async fn status_of(
        &self,
        id: &ProductId,
        product: Product,
    ) -> Result<ProductStatus, BookkeepingError> {
        let (stock, final_audit) = match product.retired {
            Some(_) => (None, self.audits.final_audit(id).await?),
            None => (self.ledger.stock(id).await?, None),
        };
        Ok(ProductStatus {
            product,
            stock,
            final_audit,
        })
    }

    /// Closes a sale early: Redis first (no order is accepted from then
    /// on), then MySQL (its `end_time` and `closed`), and says where it
    /// stands. Idempotent; the workers retire it once settled.
    /// `NoProduct` when there is no such product.
    pub async fn close(&self, id: &ProductId) -> Result<ProductStatus, BookkeepingError> {
        let product = self.product(id).await?;
        if product.retired.is_some() {
            return self.status_of(id, product).await;
        }
        let now = now_ms();
        // The Redis node's end decides orders; MySQL takes the same instant.
        let ended = match product.opened {
            Some(_) => self.lifecycle.close(id).await?,
            None => None,
        };
        let closed = self
            .products
            .close_product(id, now, ended.unwrap_or(now).min(now))
            .await?
            .ok_or(BookkeepingError::NoProduct)?;
        tracing::info!(product_id = %id, end_time = closed.end_time, "sale closed by an admin");
        self.status_of(id, closed).await
    }

    /// Pauses a sale (`pause`) or resumes it: Redis first (it decides the
    /// orders: from the next one on, on every instance), then the books
    /// (`tb_product.paused` and the event `sale.paused`/`sale.resumed`,
    /// once per change: a retry after a failure between the two writes
    /// the books' half). Refused for a sale not open (`InvalidTransition`)
    /// or closed (`SaleClosed`).
    pub async fn pause(
        &self,
        id: &ProductId,
        pause: bool,
    ) -> Result<ProductStatus, BookkeepingError> {
        let product = self.product(id).await?;
        if product.retired.is_some() || product.closed.is_some() {
            return Err(BookkeepingError::SaleClosed);
        }
        let Some(paused) = self.lifecycle.pause(id, pause).await? else {
            return Err(BookkeepingError::InvalidTransition(
                "not open (open it first)".into(),
            ));
        };
        if paused.ended {
            // Past its end a pause changes nothing and would tell the shop
            // (`sale.paused`) of a pause that holds nothing back.
            return Err(BookkeepingError::SaleEnded);
        }
        if self.products.set_paused(id, pause, paused.since_ms).await? {
            match pause {
                true => {
                    tracing::warn!(product_id = %id, "sale paused by an admin: orders are refused")
                }
                false => tracing::info!(product_id = %id, "sale resumed by an admin"),
            }
        }
        let product = self.product(id).await?;
        self.status_of(id, product).await
    }

    /// Adds `units` to an open sale, or takes them away (negative; never
    /// more than are left): Redis first (atomically with the orders: the
    /// stock and the sale's `initial` together), then the books
    /// (`tb_restock`, `initial_qty` and `available_qty`, `sale.restocked`),
    /// each once per `restock_id`, so a retry after a failure between the
    /// two finishes the books' half. Whether this call moved the stock.
    pub async fn restock(
        &self,
        id: &ProductId,
        units: i64,
        restock_id: &str,
    ) -> Result<(ProductStatus, bool), BookkeepingError> {
        let product = self.product(id).await?;
        if product.retired.is_some() || product.closed.is_some() {
            return Err(BookkeepingError::SaleClosed);
        }
        let applied = match self
            .lifecycle
            .restock(id, units, restock_id, sale::RestockBy::Operator)
            .await?
        {
            sale::RestockAnswer::NoSale => {
                return Err(BookkeepingError::InvalidTransition(
                    "not open (open it first)".into(),
                ));
            }
            sale::RestockAnswer::Ended => return Err(BookkeepingError::SaleEnded),
            sale::RestockAnswer::TooFew { left } => return Err(BookkeepingError::TooFewLeft(left)),
            sale::RestockAnswer::Done { applied, .. } => applied,
        };
        if self
            .products
            .record_restock(id, restock_id, units, now_ms())
            .await?
        {
            tracing::warn!(product_id = %id, units, restock_id, "sale restocked by an admin");
        }
        let product = self.product(id).await?;
        Ok((self.status_of(id, product).await?, applied))
    }

    /// New bounds for the sale's waiting room: Redis first (the pace
    /// keeps within them from now), then the books, as the room holds them
    /// (for a sale opened again by recovery). `None`: the sale has no room.
    pub async fn set_room_bounds(
        &self,
        id: &ProductId,
        change: BoundsChange,
    ) -> Result<Option<Arc<RoomState>>, BookkeepingError> {
        let Some(room) = self.room.set_bounds(id, change).await? else {
            return Ok(None);
        };
        let bounds = RoomBounds {
            ceiling: room.ceiling,
            floor: room.floor,
            cap: room.cap.map(|cap| u32::try_from(cap).unwrap_or(u32::MAX)),
            join_difficulty: room.join_difficulty,
        };
        self.products.set_room_bounds(id, bounds).await?;
        tracing::info!(product_id = %id, ?bounds, "waiting room bounds changed");
        Ok(Some(room))
    }
}
