//! Group commit: concurrent deliveries share one store transaction (one fsync),
//! while each caller still waits for its own message to be durable.

use std::sync::Arc;

use crate::store::{DeliveredTo, NewDelivery, Store, StoreResult};

pub struct Deliverer {
    store: Arc<dyn Store>,
}

impl Deliverer {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Deliverer { store }
    }

    /// Stores `delivery` durably; returns the UIDs it got.
    pub async fn deliver(&self, delivery: NewDelivery) -> StoreResult<Vec<DeliveredTo>> {
        let mut out = self.store.deliver_batch(std::slice::from_ref(&delivery)).await?;
        Ok(out.pop().unwrap_or_default())
    }
}
